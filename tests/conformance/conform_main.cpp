// The conformance program: runs the catalogue (each case in a worker
// process that a hang or a crash does not take the rest down with), or
// compares two runs' outputs (--compare). See conform.hpp.
#include "conform.hpp"

#include "transport/procpage.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <set>
#include <signal.h>
#include <sstream>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace conform {

// ---- output -----------------------------------------------------------------------

void Out::sep() {
    if (!text_.empty()) text_ += ' ';
}

long Out::r(const char *label, long ret) {
    const int e = errno;
    sep();
    text_ += label;
    text_ += '=';
    if (ret < 0) {
        const char *name = strerrorname_np(e);
        text_ += std::to_string(ret) + "/" + (name ? name : std::to_string(e));
    } else {
        text_ += std::to_string(ret);
    }
    errno = e;
    return ret;
}

void Out::s(const char *label, const std::string &value) {
    sep();
    text_ += label;
    text_ += '=';
    text_ += value;
}

void Out::n(const char *label, long value) { s(label, std::to_string(value)); }

void Out::bytes(const char *label, const void *data, std::size_t len) {
    const auto *p = static_cast<const unsigned char *>(data);
    std::string v = "\"";
    if (len > 48) {
        std::uint64_t h = 1469598103934665603ull;  // FNV-1a
        for (std::size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 1099511628211ull;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%zu bytes fnv %016llx", len, (unsigned long long)h);
        v += buf;
    } else {
        for (std::size_t i = 0; i < len; ++i) {
            if (p[i] >= 0x21 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\') {
                v += char(p[i]);
            } else {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
                v += buf;
            }
        }
    }
    s(label, v + "\"");
}

namespace {

std::string bit_names(unsigned bits, const std::vector<std::pair<unsigned, const char *>> &names) {
    if (bits == 0) return "0";
    std::string v;
    for (auto [bit, name] : names)
        if (bits & bit) {
            if (!v.empty()) v += '|';
            v += name;
            bits &= ~bit;
        }
    if (bits) {
        if (!v.empty()) v += '|';
        v += std::to_string(bits);
    }
    return v;
}

}  // namespace

void Out::revents(const char *label, int events) {
    if (events < 0) {
        r(label, events);
        return;
    }
    s(label, bit_names(unsigned(events), {{POLLIN, "IN"}, {POLLPRI, "PRI"}, {POLLOUT, "OUT"},
                                          {POLLERR, "ERR"}, {POLLHUP, "HUP"}, {POLLNVAL, "NVAL"},
                                          {POLLRDHUP, "RDHUP"}, {POLLRDNORM, "RDNORM"},
                                          {POLLRDBAND, "RDBAND"}, {POLLWRNORM, "WRNORM"},
                                          {POLLWRBAND, "WRBAND"}}));
}

void Out::epevents(const char *label, unsigned events) {
    s(label, bit_names(events, {{EPOLLIN, "IN"}, {EPOLLPRI, "PRI"}, {EPOLLOUT, "OUT"},
                                {EPOLLERR, "ERR"}, {EPOLLHUP, "HUP"}, {EPOLLRDHUP, "RDHUP"},
                                {EPOLLRDNORM, "RDNORM"}, {EPOLLWRNORM, "WRNORM"}}));
}

// ---- connections and their mode ------------------------------------------------------

namespace {

bool preloaded() {
    const char *p = std::getenv("LD_PRELOAD");
    return p && std::strstr(p, "sdirect");
}

// The mode of the case being run: "none" until a connection is noted,
// "direct" while every noted connection was, else "kernel:<reason>".
std::string case_mode;

std::string registry_dir() {
    if (const char *r = std::getenv("SDIRECT_REGISTRY"); r && *r) return r;
    return "/dev/shm/sdirect-" + std::to_string(getuid());
}

// The mode and reason of fd's live slot in this process's page; empty if
// there is none (yet).
std::string page_mode(int fd) {
    const std::string path = registry_dir() + "/p" + std::to_string(getpid());
    const int pf = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (pf < 0) return "";
    void *m = mmap(nullptr, sizeof(sd::transport::ProcPage), PROT_READ, MAP_SHARED, pf, 0);
    ::close(pf);
    if (m == MAP_FAILED) return "";
    const auto *page = static_cast<const sd::transport::ProcPage *>(m);
    std::string out;
    for (std::uint32_t i = 0; i < sd::transport::kSlots; ++i) {
        const auto &s = page->slots[i];
        if (s.state.load() != std::uint32_t(sd::transport::SlotState::live) || s.fd != fd) continue;
        const auto mode = sd::transport::Mode(s.mode.load());
        out = mode == sd::transport::Mode::direct ? "direct"
                                                   : "kernel:" + std::to_string(s.reason.load());
        break;
    }
    munmap(m, sizeof(sd::transport::ProcPage));
    return out;
}

}  // namespace

void msleep(int ms) {
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

void note_mode(int fd) {
    std::string mode = "plain";
    if (preloaded()) {
        // The upgrade runs beside the connection: wait for it (bounded).
        for (int i = 0; i < 600; ++i) {  // 6 s
            mode = page_mode(fd);
            if (mode == "direct") break;
            msleep(10);
        }
        if (mode.empty()) mode = "kernel:unlisted";
    }
    if (case_mode == "none" || case_mode == "direct" || case_mode == "plain") {
        if (case_mode == "none" || mode != "direct") case_mode = mode;
    }
}

int make_listener(unsigned short *port, int backlog) {
    const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l < 0 || ::bind(l, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 ||
        ::listen(l, backlog) != 0) {
        std::perror("conform: listener");
        std::abort();
    }
    socklen_t len = sizeof sa;
    ::getsockname(l, reinterpret_cast<sockaddr *>(&sa), &len);
    *port = ntohs(sa.sin_port);
    return l;
}

int connect_to(unsigned short port) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    if (s < 0 || ::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) {
        std::perror("conform: connect");
        std::abort();
    }
    return s;
}

unsigned short dead_port() {
    unsigned short port = 0;
    const int l = make_listener(&port);
    ::close(l);
    return port;
}

namespace {

void exchange(int x, int y) {
    char c = 'w';
    if (::send(x, &c, 1, MSG_NOSIGNAL) != 1 || ::recv(y, &c, 1, MSG_WAITALL) != 1 ||
        ::send(y, &c, 1, MSG_NOSIGNAL) != 1 || ::recv(x, &c, 1, MSG_WAITALL) != 1) {
        std::perror("conform: handshake");
        std::abort();
    }
}

}  // namespace

void handshake(int x, int y) {
    // An accepted socket joins the library at its first call: one byte each
    // way, then (preloaded) the wait for the upgrade, then one byte each way
    // again so that both directions have switched before the case.
    exchange(x, y);
    note_mode(x);
    note_mode(y);
    exchange(x, y);
}

Pair make_pair() {
    unsigned short port = 0;
    const int l = make_listener(&port);
    Pair p;
    p.a = connect_to(port);
    p.b = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(l);
    if (p.b < 0) std::abort();
    handshake(p.a, p.b);
    return p;
}

void Pair::close_both() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
    a = b = -1;
}

void add(std::vector<Case> &all, const char *name, CaseFn fn) { all.push_back({name, fn}); }

// ---- helpers ----------------------------------------------------------------------------

void set_nonblock(int fd, bool on) {
    const int fl = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

long fill(int fd) {
    static char chunk[65536];
    long total = 0;
    while (total < (256L << 20)) {
        const ssize_t n = ::send(fd, chunk, sizeof chunk, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN ? total : -errno;
        total += n;
    }
    return total;
}

long drain(int fd, std::string *into, int timeout_ms) {
    char buf[65536];
    for (int guard = 0; guard < 100000; ++guard) {
        if (poll1(fd, POLLIN, timeout_ms) <= 0) return -EAGAIN;
        const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EAGAIN) continue;
            return -errno;
        }
        if (into) into->append(buf, std::size_t(n));
    }
    return -EAGAIN;
}

int poll1(int fd, short events, int timeout_ms) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, timeout_ms);
    if (rc < 0) return -1;
    return rc == 0 ? 0 : p.revents;
}

std::string pattern(std::size_t n, unsigned seed) {
    std::string s(n, '\0');
    std::uint32_t x = 2463534242u + seed;
    for (std::size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        s[i] = char(x);
    }
    return s;
}

int temp_file(std::size_t n) {
    char path[] = "/tmp/conform-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) std::abort();
    ::unlink(path);
    const std::string data = pattern(n, 7);
    if (::write(fd, data.data(), n) != ssize_t(n)) std::abort();
    ::lseek(fd, 0, SEEK_SET);
    return fd;
}

namespace {
volatile sig_atomic_t sigpipe_count = 0;
void on_sigpipe(int) { sigpipe_count = sigpipe_count + 1; }
}  // namespace

int sigpipes_taken() {
    const int n = sigpipe_count;
    sigpipe_count = 0;
    return n;
}

int in_child(int (*fn)(void *), void *arg) {
    const pid_t pid = ::fork();
    if (pid < 0) std::abort();
    if (pid == 0) {
        ::alarm(5);
        ::_exit(fn(arg));
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- running and comparing ----------------------------------------------------------

namespace {

// A case that has not ended by then is reported as a hang.
constexpr int kCaseSeconds = 10;

std::vector<Case> catalogue() {
    std::vector<Case> all;
    add_fd_cases(all);
    add_flag_cases(all);
    add_iov_cases(all);
    add_end_cases(all);
    add_ready_cases(all);
    add_opt_cases(all);
    add_file_cases(all);
    add_child_cases(all);
    add_stdio_cases(all);
    add_call_cases(all);
    return all;
}

void write_all(int fd, const std::string &s) {
    std::size_t off = 0;
    while (off < s.size()) {
        const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
        if (n <= 0) _exit(3);
        off += std::size_t(n);
    }
}

// Runs cases [from, end) with results to fd as "index mode text" lines.
[[noreturn]] void worker(const std::vector<Case> &all, std::size_t from, int fd,
                         const std::string &only) {
    struct sigaction sa{};
    sa.sa_handler = on_sigpipe;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGPIPE, &sa, nullptr);
    for (std::size_t i = from; i < all.size(); ++i) {
        if (!only.empty() && only != all[i].name) continue;
        case_mode = "none";
        sigpipes_taken();
        Out out;
        ::alarm(kCaseSeconds);
        all[i].fn(out);
        ::alarm(0);
        write_all(fd, std::to_string(i) + " " + case_mode + " " + out.text() + "\n");
    }
    _exit(0);
}

int run(const std::string &modes_path, const std::string &only) {
    const std::vector<Case> all = catalogue();
    std::FILE *modes = modes_path.empty() ? nullptr : std::fopen(modes_path.c_str(), "w");
    std::size_t next = 0;
    if (!only.empty())
        while (next < all.size() && only != all[next].name) ++next;
    while (next < all.size()) {
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC) != 0) return 2;
        std::fflush(stdout);
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::close(fds[0]);
            worker(all, next, fds[1], only);
        }
        ::close(fds[1]);
        std::string buf;
        char chunk[4096];
        for (;;) {
            const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            buf.append(chunk, std::size_t(n));
            for (std::size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
                std::istringstream line(buf.substr(0, nl));
                std::size_t index = 0;
                std::string mode, text;
                line >> index >> mode;
                std::getline(line, text);
                if (!text.empty() && text[0] == ' ') text.erase(0, 1);
                std::printf("%s: %s\n", all[index].name, text.c_str());
                if (modes) std::fprintf(modes, "%s %s\n", all[index].name, mode.c_str());
                next = index + 1;
            }
        }
        ::close(fds[0]);
        int status = 0;
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
        if (!only.empty() && next > 0) break;
        // The worker died in case `next`: report it, go on after it.
        if (next >= all.size()) break;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
            std::printf("%s: TIMEOUT (no result within %d s)\n", all[next].name, kCaseSeconds);
        else if (WIFSIGNALED(status))
            std::printf("%s: DIED signal %s\n", all[next].name, sigabbrev_np(WTERMSIG(status)));
        else
            std::printf("%s: DIED exit %d\n", all[next].name, WEXITSTATUS(status));
        if (modes) std::fprintf(modes, "%s died\n", all[next].name);
        if (!only.empty()) break;
        ++next;
    }
    if (modes) std::fclose(modes);
    return 0;
}

// name -> rest of line, in file order.
std::vector<std::pair<std::string, std::string>> read_results(const std::string &path) {
    std::vector<std::pair<std::string, std::string>> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        const std::size_t colon = line.find(": ");
        if (colon == std::string::npos) continue;
        out.emplace_back(line.substr(0, colon), line.substr(colon + 2));
    }
    return out;
}

// Compares the plain run's output with the preloaded run's; differences
// must be exactly those the known list names; every preloaded case that
// made a connection must have run on direct ones.
int compare(const std::string &kernel_path, const std::string &lib_path,
            const std::string &known_path, const std::string &modes_path) {
    const auto kernel = read_results(kernel_path);
    const auto lib = read_results(lib_path);
    std::map<std::string, std::string> lib_by_name(lib.begin(), lib.end());
    std::map<std::string, std::string> known;
    {
        std::ifstream in(known_path);
        for (std::string line; std::getline(in, line);) {
            if (line.empty() || line[0] == '#') continue;
            const std::size_t sp = line.find_first_of(" \t");
            const std::size_t why = line.find_first_not_of(" \t", sp);
            known[line.substr(0, sp)] = why == std::string::npos ? "" : line.substr(why);
        }
    }
    int failures = 0, known_seen = 0;
    std::set<std::string> names;
    for (const auto &[name, text] : kernel) {
        names.insert(name);
        auto it = lib_by_name.find(name);
        const std::string other = it == lib_by_name.end() ? "(missing)" : it->second;
        const bool differs = other != text;
        const bool listed = known.count(name) != 0;
        if (differs && listed) {
            ++known_seen;
            std::printf("known difference  %s\n    kernel:  %s\n    library: %s\n", name.c_str(),
                        text.c_str(), other.c_str());
        } else if (differs) {
            ++failures;
            std::printf("DIFFERENCE        %s\n    kernel:  %s\n    library: %s\n", name.c_str(),
                        text.c_str(), other.c_str());
        } else if (listed && known[name].rfind("sometimes:", 0) == 0) {
            std::printf("matched this time %s (listed as a difference that does not always show)\n",
                        name.c_str());
        } else if (listed) {
            ++failures;
            std::printf("NO LONGER DIFFERS %s (remove it from known_differences.txt)\n    both:    %s\n",
                        name.c_str(), text.c_str());
        }
    }
    for (const auto &[name, text] : lib)
        if (!names.count(name)) {
            ++failures;
            std::printf("ONLY UNDER THE LIBRARY %s: %s\n", name.c_str(), text.c_str());
        }
    for (const auto &[name, why] : known)
        if (!names.count(name)) {
            ++failures;
            std::printf("UNKNOWN CASE in known_differences.txt: %s\n", name.c_str());
        }
    int direct = 0, without = 0;
    std::string direct_names;
    {
        std::ifstream in(modes_path);
        for (std::string line; std::getline(in, line);) {
            std::istringstream l(line);
            std::string name, mode;
            l >> name >> mode;
            if (mode == "direct") {
                ++direct;
                direct_names += " " + name;
            } else if (mode == "none") {
                ++without;
            } else if (mode != "died") {
                ++failures;
                std::printf("NOT DIRECT        %s ran on a connection in mode %s\n", name.c_str(),
                            mode.c_str());
            }
        }
    }
    std::printf("\n%zu cases: %d on direct connections, %d without a connection; "
                "%d known differences; %d failures\n",
                kernel.size(), direct, without, known_seen, failures);
    std::printf("cases on direct connections:%s\n", direct_names.c_str());
    return failures == 0 ? 0 : 1;
}

}  // namespace

}  // namespace conform

int main(int argc, char **argv) {
    std::string modes, only;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--compare" && i + 4 < argc)
            return conform::compare(argv[i + 1], argv[i + 2], argv[i + 3], argv[i + 4]);
        if (a == "--list") {
            for (const auto &c : conform::catalogue()) std::printf("%s\n", c.name);
            return 0;
        }
        if (a == "--modes" && i + 1 < argc) modes = argv[++i];
        else if (a == "--only" && i + 1 < argc) only = argv[++i];
        else {
            std::fprintf(stderr,
                         "usage: conform [--modes FILE] [--only CASE] | --list |\n"
                         "       conform --compare KERNEL_OUT LIBRARY_OUT KNOWN_LIST LIBRARY_MODES\n");
            return 2;
        }
    }
    return conform::run(modes, only);
}
