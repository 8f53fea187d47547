// sdirect-info: the libfabric this host offers and every SDIRECT_* setting.
//
// libfabric is opened with dlopen, as the library does, so the tool runs
// (and still prints the settings) on a host without it.
#include "transport/rules.hpp"
#include "transport/settings.hpp"

#include <dlfcn.h>
#include <rdma/fabric.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace tp = sd::transport;

struct Fabric {
    using getinfo_fn = int (*)(std::uint32_t, const char *, const char *, std::uint64_t,
                               const fi_info *, fi_info **);
    using freeinfo_fn = void (*)(fi_info *);
    using dupinfo_fn = fi_info *(*)(const fi_info *);
    using version_fn = std::uint32_t (*)();
    using strerror_fn = const char *(*)(int);

    void *handle = nullptr;
    getinfo_fn getinfo = nullptr;
    freeinfo_fn freeinfo = nullptr;
    dupinfo_fn dupinfo = nullptr;
    version_fn version = nullptr;
    strerror_fn strerror = nullptr;
};

// Returns an empty string on success, else why libfabric is unusable.
std::string open_fabric(Fabric &f) {
    // Debian's libfabric drags in libinfinipath, whose constructor installs
    // signal handlers unless told not to; the variables must be set before
    // dlopen runs that constructor. Values the user chose are kept.
    setenv("IPATH_NO_BACKTRACE", "1", 0);
    setenv("HFI_NO_BACKTRACE", "1", 0);
    setenv("FI_MR_CACHE_MONITOR", "disabled", 0);

    f.handle = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!f.handle) {
        const char *why = dlerror();
        return why ? why : "dlopen failed";
    }
    f.getinfo = reinterpret_cast<Fabric::getinfo_fn>(dlsym(f.handle, "fi_getinfo"));
    f.freeinfo = reinterpret_cast<Fabric::freeinfo_fn>(dlsym(f.handle, "fi_freeinfo"));
    f.dupinfo = reinterpret_cast<Fabric::dupinfo_fn>(dlsym(f.handle, "fi_dupinfo"));
    f.version = reinterpret_cast<Fabric::version_fn>(dlsym(f.handle, "fi_version"));
    f.strerror = reinterpret_cast<Fabric::strerror_fn>(dlsym(f.handle, "fi_strerror"));
    if (!f.getinfo || !f.freeinfo || !f.dupinfo || !f.version)
        return "libfabric.so.1 lacks fi_getinfo/fi_freeinfo/fi_dupinfo/fi_version";
    return {};
}

struct Provider {
    std::string prov;
    std::string fabric;
    std::vector<std::string> domains;
};

// Prints `text` wrapped at `width` columns: the first line after `head`,
// the others indented by `indent`.
void print_wrapped(std::string_view text, std::string head, std::size_t indent, std::size_t width) {
    std::string line = std::move(head);
    std::size_t empty = line.size();
    std::size_t pos = 0;
    while (pos < text.size()) {
        std::size_t space = text.find(' ', pos);
        std::size_t len = space == std::string_view::npos ? text.size() - pos : space - pos;
        std::string_view word = text.substr(pos, len);
        pos += len + 1;
        if (word.empty()) continue;
        if (line.size() > empty && line.size() + 1 + word.size() > width) {
            std::puts(line.c_str());
            line.assign(indent, ' ');
            empty = indent;
        }
        if (line.size() > empty) line += ' ';
        line += word;
    }
    if (line.size() > empty) std::puts(line.c_str());
}

void print_fabric(const std::string &wanted) {
    Fabric f;
    if (std::string why = open_fabric(f); !why.empty()) {
        std::printf("libfabric: not available (%s); the library runs as a pass-through\n",
                    why.c_str());
        return;
    }
    std::uint32_t runtime = f.version();
    std::printf("libfabric %u.%u (headers %u.%u)\n", runtime >> 16, runtime & 0xffff,
                unsigned(FI_MAJOR_VERSION), unsigned(FI_MINOR_VERSION));

    // Ask for no more than both the headers and the runtime know.
    std::uint32_t ask = std::min<std::uint32_t>(runtime, FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION));
    fi_info *hints = f.dupinfo(nullptr);
    if (!hints || !hints->ep_attr) {
        std::printf("providers: cannot allocate hints\n");
        return;
    }
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG;
    fi_info *list = nullptr;
    int rc = f.getinfo(ask, nullptr, nullptr, 0, hints, &list);
    f.freeinfo(hints);
    if (rc != 0) {
        std::printf("providers (RDM endpoints, FI_MSG): none (%s)\n",
                    f.strerror ? f.strerror(-rc) : std::to_string(rc).c_str());
        std::printf("SDIRECT_PROVIDER=%s: not available\n", wanted.c_str());
        return;
    }

    std::vector<Provider> seen;  // one per (provider, fabric), first-seen order
    for (const fi_info *i = list; i; i = i->next) {
        std::string prov = i->fabric_attr && i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "?";
        std::string fabric = i->fabric_attr && i->fabric_attr->name ? i->fabric_attr->name : "?";
        std::string domain = i->domain_attr && i->domain_attr->name ? i->domain_attr->name : "?";
        auto it = std::find_if(seen.begin(), seen.end(), [&](const Provider &p) {
            return p.prov == prov && p.fabric == fabric;
        });
        if (it == seen.end()) {
            seen.push_back({prov, fabric, {}});
            it = seen.end() - 1;
        }
        if (std::find(it->domains.begin(), it->domains.end(), domain) == it->domains.end())
            it->domains.push_back(domain);
    }
    f.freeinfo(list);

    // One line per provider; its fabrics (with their domains) wrap beneath.
    std::size_t w = 8;
    for (const Provider &p : seen) w = std::max(w, p.prov.size());
    std::printf("providers (RDM endpoints, FI_MSG):\n");
    bool found = false;
    for (std::size_t i = 0; i < seen.size(); ++i) {
        bool first = true;
        for (std::size_t j = 0; j < i; ++j) first = first && seen[j].prov != seen[i].prov;
        if (!first) continue;
        std::string places;
        for (std::size_t j = i; j < seen.size(); ++j) {
            if (seen[j].prov != seen[i].prov) continue;
            std::string domains;
            for (const std::string &d : seen[j].domains) domains += (domains.empty() ? "" : " ") + d;
            places += (places.empty() ? "" : ", ") + seen[j].fabric;
            if (domains != seen[j].fabric) places += " (" + domains + ")";
        }
        std::string head = "  " + seen[i].prov;
        head.resize(2 + w + 2, ' ');
        print_wrapped(places, head, 2 + w + 2, 78);
        // Layered providers are named "tcp;ofi_rxm"; the setting names the whole string.
        if (seen[i].prov == wanted) found = true;
    }
    std::printf("SDIRECT_PROVIDER=%s: %s\n", wanted.c_str(), found ? "available" : "not available");
}

const char *kind_name(tp::SettingKind k) {
    switch (k) {
    case tp::SettingKind::integer: return "integer";
    case tp::SettingKind::text: return "text";
    case tp::SettingKind::boolean: return "boolean";
    }
    return "?";
}

void print_settings() {
    std::size_t count = 0;
    const tp::Setting *table = tp::setting_table(&count);
    std::printf("\nsettings (environment variables):\n");
    for (std::size_t i = 0; i < count; ++i) {
        const tp::Setting &s = table[i];
        const char *now = std::getenv(s.name);
        std::printf("\n  %s (%s)\n", s.name, kind_name(s.kind));
        std::printf("    default: %s\n", *s.fallback ? s.fallback : "(empty)");
        std::printf("    current: %s\n", now ? (*now ? now : "(empty)") : "(unset)");
        print_wrapped(s.help, std::string(4, ' '), 4, 78);
    }
    std::printf("\nregistry in effect: %s\n", tp::settings().registry);
}

void print_rules() {
    if (!tp::rules_active()) {
        std::printf("\nrules: none (SDIRECT_RULES unset): every connection may go direct\n");
        return;
    }
    const tp::RuleSet &set = tp::rules();
    std::printf("\nrules from %s, the first match decides (no match: direct):\n",
                tp::settings().rules);
    if (set.error[0]) {
        std::printf("  unusable: %s\n  every connection stays on TCP (reason rule)\n", set.error);
        return;
    }
    if (!set.count) std::printf("  (none)\n");
    for (std::size_t i = 0; i < set.count; ++i) {
        char line[256];
        tp::format_rule(set.rules[i], line, sizeof line);
        std::printf("  %s\n", line);
    }
}

}  // namespace

int main(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        if (a == "-h" || a == "--help") {
            std::puts("usage: sdirect-info\n"
                      "Prints the libfabric version and its RDM providers, then every\n"
                      "SDIRECT_* setting with its default, current value and meaning.");
            return 0;
        }
        std::fprintf(stderr, "sdirect-info: unknown argument '%s'\n", argv[i]);
        return 2;
    }
    // Unparsable values are reported on stderr here, as the library would.
    tp::load_settings();
    print_fabric(tp::settings().provider);
    tp::load_rules();
    print_settings();
    print_rules();
    return 0;
}
