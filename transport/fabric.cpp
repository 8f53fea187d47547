#include "fabric.hpp"
#include "clock.hpp"
#include "exitstats.hpp"

#include "log.hpp"
#include "regionlock.hpp"
#include "settings.hpp"
#include "sys.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <dlfcn.h>
#include <mutex>

namespace sd::transport {
namespace {

struct Api {
    int (*getinfo)(std::uint32_t, const char *, const char *, std::uint64_t,
                   const fi_info *, fi_info **);
    void (*freeinfo)(fi_info *);
    fi_info *(*dupinfo)(const fi_info *);
    int (*fabric)(fi_fabric_attr *, fid_fabric **, void *);
    const char *(*strerror)(int);
    std::uint32_t (*version)();
};

Api api;
std::once_flag loaded;
bool usable = false;
std::atomic<bool> exiting{false};
std::atomic<bool> parked{false};

// Between two steps of the build: once the process is exiting, nothing is
// to be gained from the endpoint, and libfabric's destructor must not run
// under a call into it, so the building thread stops here for good.
void park_if_exiting() noexcept {
    if (!exiting.load(std::memory_order_acquire)) return;
    parked.store(true, std::memory_order_release);
    for (;;) {
        timespec nap{3600, 0};
        nanosleep(&nap, nullptr);
    }
}

// Variables the provider libraries read while they load and initialise:
// keep libinfinipath/libpsm2 from installing backtrace handlers, and
// libfabric's MR cache from hooking memory. Each is set only if the
// application has not, and stays for the process's life: the engine of
// a forked child initialises the providers again, after the parent's
// endpoint opened. Taken away once the endpoint was open, they let a
// provider library of sshd's pre-auth child (forked, chrooted, under
// seccomp) install its own fault handling, and the child died of SIGSYS.
struct EnvPin {
    const char *name;
    const char *value;
};
constexpr EnvPin pins[] = {{"IPATH_NO_BACKTRACE", "1"},
                           {"HFI_NO_BACKTRACE", "1"},
                           {"FI_MR_CACHE_MONITOR", "disabled"}};

// libfabric links libpsm2 (Omni-Path) and libpsm_infinipath (TrueScale),
// whose constructors each spend about 100 ms timing the CPU's cycle
// counter (sleeping, pinned to CPU 0). On a host without their hardware,
// and unless SDIRECT_PROVIDER names their provider, a stand-in from beside
// libsdirect.so is loaded first under the same soname
// (transport/standin_psm.cpp), and libfabric links that instead. Not where
// the real library is loaded already: the loader would use it anyway.
struct StandIn {
    const char *soname;
    const char *file;
    const char *provider;
    const char *device_prefix;  // in /sys/class/infiniband
};
constexpr StandIn standins[] = {
    {"libpsm2.so.2", "libsdirect-psm2.so", "psm2", "hfi1"},
    {"libpsm_infinipath.so.1", "libsdirect-psm.so", "psm", "qib"},
};

bool device_present(const char *prefix) noexcept {
    DIR *d = opendir("/sys/class/infiniband");
    if (!d) return false;
    bool found = false;
    while (const dirent *e = readdir(d))
        if (!std::strncmp(e->d_name, prefix, std::strlen(prefix))) found = true;
    closedir(d);
    return found;
}

// The stand-ins loaded (to be unloaded if libfabric will not link them).
void *load_standins(void *(&handles)[std::size(standins)]) noexcept {
    Dl_info self{};
    if (!dladdr(reinterpret_cast<void *>(&device_present), &self) || !self.dli_fname) return nullptr;
    const char *slash = std::strrchr(self.dli_fname, '/');
    const std::size_t dir_len = slash ? std::size_t(slash - self.dli_fname) : 0;
    const char *wanted = settings().provider ? settings().provider : "";
    void *any = nullptr;
    for (std::size_t i = 0; i < std::size(standins); ++i) {
        const StandIn &s = standins[i];
        handles[i] = nullptr;
        if (!std::strcmp(wanted, s.provider) || device_present(s.device_prefix)) continue;
        if (void *real = dlopen(s.soname, RTLD_NOW | RTLD_NOLOAD)) {
            dlclose(real);
            continue;
        }
        char path[4096];
        if (std::snprintf(path, sizeof path, "%.*s/%s", int(dir_len), self.dli_fname, s.file) >=
            int(sizeof path))
            continue;
        handles[i] = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (handles[i]) any = handles[i];
        else SD_LOG(info, "stand-in %s not loaded (%s): libfabric loads the real %s, whose "
                          "constructor sleeps about 100 ms in each process that builds an engine",
                    path, dlerror(), s.soname);
    }
    return any;
}

void load() noexcept {
    Guard guard;
    void *standin[std::size(standins)];
    const bool stood_in = load_standins(standin) != nullptr;
    void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h && stood_in) {
        // A libfabric that needs more of them than the stand-ins offer:
        // the real libraries, at their price.
        SD_LOG(info, "libfabric did not load beside the psm stand-ins (%s); loading it as built",
               dlerror());
        for (void *s : standin)
            if (s) dlclose(s);
        h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        SD_LOG(info, "libfabric not loadable (%s); staying on TCP", dlerror());
        return;
    }
    api.getinfo = reinterpret_cast<decltype(api.getinfo)>(dlsym(h, "fi_getinfo"));
    api.freeinfo = reinterpret_cast<decltype(api.freeinfo)>(dlsym(h, "fi_freeinfo"));
    api.dupinfo = reinterpret_cast<decltype(api.dupinfo)>(dlsym(h, "fi_dupinfo"));
    api.fabric = reinterpret_cast<decltype(api.fabric)>(dlsym(h, "fi_fabric"));
    api.strerror = reinterpret_cast<decltype(api.strerror)>(dlsym(h, "fi_strerror"));
    api.version = reinterpret_cast<decltype(api.version)>(dlsym(h, "fi_version"));
    usable = api.getinfo && api.freeinfo && api.dupinfo && api.fabric && api.strerror;
}

// shm installs handlers for these on its first endpoint; they unlink region
// names and chain. The application's own dispositions must win.
constexpr int kTouchedSignals[] = {SIGBUS, SIGSEGV, SIGTERM, SIGINT, SIGILL, SIGABRT};

}  // namespace

void fabric_pin_environment() noexcept {
    for (const EnvPin &p : pins) setenv(p.name, p.value, 0);
}

bool fabric_available() noexcept {
    std::call_once(loaded, load);
    return usable;
}

std::uint32_t fabric_version() noexcept {
    return fabric_available() && api.version ? api.version() : 0;
}

const char *fabric_strerror(int err) noexcept {
    return usable ? api.strerror(err < 0 ? -err : err) : "libfabric not loaded";
}

void fabric_exit_began() noexcept { exiting.store(true, std::memory_order_release); }
bool fabric_exiting() noexcept { return exiting.load(std::memory_order_acquire); }
bool fabric_builder_parked() noexcept { return parked.load(std::memory_order_acquire); }

int endpoint_open(Endpoint &e, const char *provider, const char *unique) noexcept {
    park_if_exiting();
    // Timed for the log: loading libfabric (its libraries' constructors
    // run here), then the endpoint (the first one sets up every provider).
    const std::uint64_t t0 = monotonic_ns();
    if (!fabric_available()) return -ENOSYS;
    const std::uint64_t t1 = monotonic_ns();
    park_if_exiting();  // the dlopen is over: the exit's loader lock is free
    Guard guard;
    struct sigaction saved[sizeof kTouchedSignals / sizeof kTouchedSignals[0]];
    std::uint32_t sets[std::size(kTouchedSignals)];
    for (std::size_t i = 0; i < std::size(kTouchedSignals); ++i) {
        sets[i] = app_disposition_sets(kTouchedSignals[i]);
        sigaction(kTouchedSignals[i], nullptr, &saved[i]);
    }
    // Back as they were, or as the application set them meanwhile on a
    // thread of its own: what was saved here is hundreds of ms old by then
    // (the provider's probing).
    auto restore = [&]() {
        for (std::size_t i = 0; i < std::size(kTouchedSignals); ++i) {
            if (app_disposition_sets(kTouchedSignals[i]) != sets[i])
                put_back_app_disposition(kTouchedSignals[i]);
            else
                sigaction(kTouchedSignals[i], &saved[i], nullptr);
        }
    };

    fi_info *hints = api.dupinfo(nullptr);
    hints->ep_attr->type = FI_EP_RDM;
    // RMA writes carry bulk data straight into the peer's receive ring;
    // RMA reads fetch advertised send buffers (read zero-copy).
    hints->caps = FI_MSG | FI_MULTI_RECV | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_READ |
                  FI_REMOTE_READ;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->tx_attr->op_flags = 0;
    hints->fabric_attr->prov_name = strdup(provider);
    if (unique && !std::strcmp(provider, "shm")) {
        hints->addr_format = FI_ADDR_STR;
        hints->src_addr = strdup(unique);
        hints->src_addrlen = std::strlen(unique) + 1;
    }
    int rc = api.getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &e.info);
    e.can_read = rc == 0;
    if (rc) {
        // A provider without RMA reads still does everything else.
        hints->caps &= ~std::uint64_t(FI_READ | FI_REMOTE_READ);
        park_if_exiting();
        rc = api.getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &e.info);
    }
    api.freeinfo(hints);
    park_if_exiting();  // before the provider creates its region and handlers
    // The steps that make the endpoint run inside the provider gate, as
    // every later provider call does: an exit that began after the look
    // above waits for them, or refuses them (and then the process ends
    // with what was made so far).
    InProvider in;
    if (!in.ok()) return -ECANCELED;
    auto fail = [&](const char *what, int err) {
        SD_LOG(error, "fabric %s failed: %s", what, fabric_strerror(err));
        endpoint_close(e);
        restore();
        return err < 0 ? err : -EIO;
    };
    if (rc) {
        // The usual cause is a provider name this libfabric does not have.
        SD_LOG(error, "SDIRECT_PROVIDER=%s: libfabric offers no such endpoint here (%s); "
                      "sdirect-info lists the providers it has",
               provider, fabric_strerror(rc));
        return fail("getinfo", rc);
    }
    if ((rc = api.fabric(e.info->fabric_attr, &e.fabric, nullptr))) return fail("fabric", rc);
    if ((rc = fi_domain(e.fabric, e.info, &e.domain, nullptr))) return fail("domain", rc);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((rc = fi_av_open(e.domain, &av_attr, &e.av, nullptr))) return fail("av_open", rc);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_NONE;  // shm cannot sleep: the doorbell does
    cq_attr.size = 4096;
    if ((rc = fi_cq_open(e.domain, &cq_attr, &e.cq, nullptr))) return fail("cq_open", rc);
    if ((rc = fi_endpoint(e.domain, e.info, &e.ep, nullptr))) return fail("endpoint", rc);
    if ((rc = fi_ep_bind(e.ep, &e.av->fid, 0))) return fail("bind av", rc);
    // Selective completion: sends made with FI_INJECT and no FI_COMPLETION
    // never produce a CQ entry, so the send path never reads the CQ.
    if ((rc = fi_ep_bind(e.ep, &e.cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)))
        return fail("bind cq", rc);
    if ((rc = fi_enable(e.ep))) return fail("enable", rc);
    e.name_len = sizeof e.name - 1;
    if ((rc = fi_getname(&e.ep->fid, e.name, &e.name_len))) return fail("getname", rc);
    e.inject_size = e.info->tx_attr->inject_size;
    e.rma_iov_limit = e.info->tx_attr->iov_limit ? int(e.info->tx_attr->iov_limit) : 1;

    restore();
    SD_LOG(debug, "libfabric loaded in %.1f ms, endpoint open in %.1f ms", double(t1 - t0) / 1e6,
           double(monotonic_ns() - t1) / 1e6);
    return 0;
}

void endpoint_close(Endpoint &e) noexcept {
    Guard guard;
    if (e.ep) fi_close(&e.ep->fid);
    if (e.cq) fi_close(&e.cq->fid);
    if (e.av) fi_close(&e.av->fid);
    if (e.domain) fi_close(&e.domain->fid);
    if (e.fabric) fi_close(&e.fabric->fid);
    if (e.info) api.freeinfo(e.info);
    e = Endpoint{};
}

}  // namespace sd::transport
