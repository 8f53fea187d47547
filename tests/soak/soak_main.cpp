// soak-worker: the soak's processes.
//
//   soak-worker soak --bytes N --seconds T --procs P --clients K --actions LIST [--seed S]
//       runs sessions (P at a time) until N bytes have been started or 3/4
//       of T has passed, and beside them K one-shot clients against one
//       server; prints one line per session and a summary; exit 1 on any
//       error or hang.
//   soak-worker resume STATE        a side carrying on after exec
//   soak-worker client PORT SEED LEN  one one-shot client
//
// A session: side 0 listens and accepts, side 1 connects (each a process
// group of its own); both send one stream and check the other's. Their
// supervisor stops and continues them, kills one of them, and kills both
// at the session's bound (a hang). A side whose peer was killed must end
// with EOF or a reset and never with a wrong byte; a side whose peer was
// not killed must receive everything.
#include "soak.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

namespace soak {
namespace {

double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

void msleep(long ms) {
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

Shared *make_shared(int *fd) {
    *fd = ::memfd_create("soak-shared", 0);
    if (*fd < 0 || ::ftruncate(*fd, sizeof(Shared)) != 0) return nullptr;
    void *m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    return m == MAP_FAILED ? nullptr : static_cast<Shared *>(m);
}

int listener(unsigned short *port) {
    const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (l < 0 || ::bind(l, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 || ::listen(l, 64) != 0 ||
        ::getsockname(l, reinterpret_cast<sockaddr *>(&sa), &len) != 0)
        return -1;
    *port = ntohs(sa.sin_port);
    return l;
}

int connect_to(unsigned short port) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    if (::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) return -1;
    return s;
}

std::string describe(int status) {
    if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("signal ") + sigabbrev_np(WTERMSIG(status));
    return "?";
}

// ---- one session --------------------------------------------------------------------

[[noreturn]] void start_side(int side, Shared *sh, int shm_fd, std::uint64_t seed, std::uint64_t total,
                             unsigned actions) {
    ::setpgid(0, 0);
    Side s;
    s.side = side;
    s.shm_fd = shm_fd;
    s.seed = seed;
    s.total = total;
    s.actions = actions;
    s.rng = seed * 7 + std::uint64_t(side);
    if (side == 0) {
        unsigned short port = 0;
        const int l = listener(&port);
        if (l < 0) _exit(6);
        sh->port = port;
        s.fd = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
        ::close(l);
    } else {
        s.fd = connect_to(static_cast<unsigned short>(sh->port.load()));
    }
    if (s.fd < 0) _exit(6);
    run_side(s);
}

// Runs one session to its end; returns its report line.
std::string session(std::uint64_t seed, std::uint64_t total, unsigned actions, double bound_s) {
    int shm_fd;
    Shared *sh = make_shared(&shm_fd);
    if (!sh) return "session seed=" + std::to_string(seed) + " result=error error=no shared memory";
    std::uint64_t rng = seed ^ 0x5e55;
    const double start = now_s();
    pid_t pid[2] = {-1, -1};
    int status[2] = {0, 0};
    bool ended[2] = {false, false};
    pid[0] = ::fork();
    if (pid[0] == 0) start_side(0, sh, shm_fd, seed, total, actions);
    ::setpgid(pid[0], pid[0]);
    while (sh->port == 0 && now_s() - start < 30) msleep(1);
    pid[1] = ::fork();
    if (pid[1] == 0) start_side(1, sh, shm_fd, seed, total, actions);
    ::setpgid(pid[1], pid[1]);

    // Kills and stops come at points of progress (bytes checked, both
    // directions), so that they land mid-stream however fast it runs.
    const double whole = 2.0 * double(total);
    auto progress = [&] { return double(sh->verified[0] + sh->verified[1]) / whole; };
    const bool will_kill = (actions & a_kill) && splitmix(rng) % 3 == 0;
    const double kill_at = 0.05 + double(splitmix(rng) % 900) / 1000.0;
    int killed = -1;
    bool hang = false;
    double next_stop = double(splitmix(rng) % 300) / 1000.0;
    unsigned stops = 0;
    while (!(ended[0] && ended[1])) {
        for (int i = 0; i < 2; ++i)
            if (!ended[i] && ::waitpid(pid[i], &status[i], WNOHANG) == pid[i]) ended[i] = true;
        const double t = now_s();
        if (t - start > bound_s) {
            hang = true;
            for (int i = 0; i < 2; ++i)
                if (!ended[i]) {
                    ::kill(-pid[i], SIGCONT);
                    ::kill(-pid[i], SIGKILL);
                    ::waitpid(pid[i], &status[i], 0);
                    ended[i] = true;
                }
            break;
        }
        const double done = progress();
        if (will_kill && killed < 0 && done >= kill_at) {
            killed = int(splitmix(rng) % 2);
            const pid_t victim = sh->pid[killed];
            if (victim > 0 && !ended[killed]) ::kill(victim, SIGKILL);
        }
        if ((actions & a_stop) && done >= next_stop) {
            const int side = int(splitmix(rng) % 2);
            const pid_t victim = sh->pid[side];
            if (victim > 0 && !ended[side]) {
                ++stops;
                ::kill(victim, SIGSTOP);
                msleep(long(20 + splitmix(rng) % 200));
                ::kill(victim, SIGCONT);
            }
            next_stop = done + double(50 + splitmix(rng) % 250) / 1000.0;
        }
        msleep(1);
    }
    // Descendants (idle children) of a killed side: none must outlive it.
    for (int i = 0; i < 2; ++i) ::kill(-pid[i], SIGKILL);

    std::string result = "ok", error;
    const bool done0 = sh->outcome[0] == o_done, done1 = sh->outcome[1] == o_done;
    for (int i = 0; i < 2; ++i) {
        if (sh->outcome[i] == o_error) {
            result = "error";
            error += std::string(error.empty() ? "" : "; ") + sh->error[i];
        }
    }
    if (hang) {
        result = "hang";
        error += " (sides at verified " + std::to_string(sh->verified[0]) + "/" + std::to_string(sh->verified[1]) +
                 " of " + std::to_string(total) + ")";
    } else if (result == "ok" && killed >= 0) {
        // The survivor ended whole, or at EOF / a reset.
        const int other = 1 - killed;
        if (sh->outcome[other] != o_done && sh->outcome[other] != o_peer_gone) {
            result = "error";
            error = "survivor side " + std::to_string(other) + ": " + describe(status[other]);
        } else {
            result = "killed";
        }
    } else if (result == "ok" && !(done0 && done1 && sh->verified[0] == total && sh->verified[1] == total)) {
        result = "error";
        for (int i = 0; i < 2; ++i)
            if (sh->outcome[i] != o_done)
                error += (sh->outcome[i] == o_peer_gone ? std::string(sh->error[i])
                                                        : "side " + std::to_string(i) + " " + describe(status[i])) +
                         " (of " + std::to_string(total) + "); ";
    }
    char line[1024];
    std::snprintf(line, sizeof line,
                  "session seed=%llu bytes=%llu result=%s verified=%llu forks=%u execs=%u uid_drops=%u "
                  "close_ranges=%u eintr=%u stops=%u killed=%d seconds=%.1f%s%s",
                  (unsigned long long)seed, (unsigned long long)total, result.c_str(),
                  (unsigned long long)(sh->verified[0] + sh->verified[1]), sh->forks.load(), sh->execs.load(),
                  sh->uid_drops.load(), sh->close_ranges.load(), sh->eintr.load(), stops, killed,
                  now_s() - start, error.empty() ? "" : " error=", error.c_str());
    munmap(sh, sizeof(Shared));
    ::close(shm_fd);
    return line;
}

// ---- one-shot clients -----------------------------------------------------------------

std::string oneshots(std::uint64_t seed, unsigned clients, double bound_s) {
    int shm_fd;
    Shared *sh = make_shared(&shm_fd);
    if (!sh) return "oneshot result=error error=no shared memory";
    const double start = now_s();
    const pid_t server = ::fork();
    if (server == 0) {
        ::setpgid(0, 0);
        unsigned short port = 0;
        const int l = listener(&port);
        if (l < 0) _exit(6);
        sh->port = port;
        _exit(oneshot_server(l, sh, int(bound_s) + 5));
    }
    ::setpgid(server, server);
    while (sh->port == 0 && now_s() - start < 30) msleep(1);
    const std::string port = std::to_string(sh->port.load());
    std::uint64_t rng = seed ^ 0x0e5e;
    unsigned ok = 0, killed = 0, failed = 0, hangs = 0, started = 0;
    std::string error;
    struct Client {
        pid_t pid;
        double started, kill_at;
        bool killed;
    };
    std::vector<Client> running;
    while ((started < clients || !running.empty())) {
        const double t = now_s();
        while (started < clients && running.size() < 3 && t - start < bound_s * 0.8) {
            const std::string cseed = std::to_string(splitmix(rng));
            std::uint64_t len = 1 + splitmix(rng) % (1u << (splitmix(rng) % 22));
            const std::string clen = std::to_string(len);
            const pid_t pid = ::fork();
            if (pid == 0) {
                ::execl("/proc/self/exe", "soak-worker", "client", port.c_str(), cseed.c_str(), clen.c_str(),
                        (char *)nullptr);
                _exit(7);
            }
            const bool kill_it = splitmix(rng) % 4 == 0;
            running.push_back({pid, t, kill_it ? t + double(splitmix(rng) % 400) / 1000.0 : 1e300, false});
            ++started;
        }
        if (started < clients && t - start >= bound_s * 0.8) clients = started;  // out of time
        for (auto it = running.begin(); it != running.end();) {
            int st;
            if (::waitpid(it->pid, &st, WNOHANG) == it->pid) {
                if (it->killed) ++killed;
                else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ++ok;
                else {
                    ++failed;
                    if (error.empty()) error = "client " + describe(st);
                }
                it = running.erase(it);
                continue;
            }
            if (!it->killed && t >= it->kill_at) {
                ::kill(it->pid, SIGKILL);
                it->killed = true;
            } else if (t - it->started > 30) {
                ::kill(it->pid, SIGKILL);
                ::waitpid(it->pid, &st, 0);
                ++hangs;
                it = running.erase(it);
                continue;
            }
            ++it;
        }
        msleep(2);
    }
    sh->os_stop = 1;
    int st;
    double wait_from = now_s();
    while (::waitpid(server, &st, WNOHANG) != server) {
        if (now_s() - wait_from > 30) {
            ::kill(-server, SIGKILL);
            ::waitpid(server, &st, 0);
            ++hangs;
            error += " server did not end";
            break;
        }
        msleep(10);
    }
    if (sh->os_wrong) error += std::string(" ") + sh->os_error;
    if (sh->os_aborted > killed) {
        ++failed;
        error += " server saw " + std::to_string(sh->os_aborted) + " connections end early, " +
                 std::to_string(killed) + " clients were killed";
    }
    const bool bad = failed || hangs || sh->os_wrong;
    char line[1024];
    std::snprintf(line, sizeof line,
                  "oneshot clients=%u result=%s ok=%u killed=%u failed=%u hangs=%u server_ok=%llu "
                  "server_aborted=%llu server_wrong=%llu verified=%llu%s%s",
                  started, bad ? (hangs ? "hang" : "error") : "ok", ok, killed, failed, hangs,
                  (unsigned long long)sh->os_ok.load(), (unsigned long long)sh->os_aborted.load(),
                  (unsigned long long)sh->os_wrong.load(), (unsigned long long)(sh->os_bytes.load() * 2),
                  error.empty() ? "" : " error=", error.c_str());
    munmap(sh, sizeof(Shared));
    ::close(shm_fd);
    return line;
}

// ---- the whole soak --------------------------------------------------------------------

std::uint64_t field(const std::string &line, const char *key) {
    const std::string k = std::string(" ") + key + "=";
    const std::size_t at = line.find(k);
    return at == std::string::npos ? 0 : std::strtoull(line.c_str() + at + k.size(), nullptr, 10);
}

int run_soak(std::uint64_t bytes, double seconds, unsigned procs, unsigned clients, unsigned actions,
         std::uint64_t seed) {
    std::printf("soak: %llu bytes, %.0f s, %u sessions at a time, %u one-shot clients, actions %s, seed %llu\n",
                (unsigned long long)bytes, seconds, procs, clients, action_names(actions).c_str(),
                (unsigned long long)seed);
    std::fflush(stdout);
    const double start = now_s();
    int res[2];
    if (::pipe2(res, O_CLOEXEC) != 0) return 2;
    std::vector<pid_t> kids;
    auto spawn = [&](auto fn) {
        std::fflush(stdout);
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::close(res[0]);
            const std::string line = fn() + "\n";
            if (::write(res[1], line.data(), line.size()) < 0) _exit(1);
            _exit(0);
        }
        kids.push_back(pid);
    };
    if (clients) spawn([&] { return oneshots(seed, clients, seconds * 0.75); });
    std::uint64_t started = 0, rng = seed;
    unsigned sessions = 0, running = 0;
    std::uint64_t verified = 0;
    unsigned ok = 0, killed = 0, errors = 0, hangs = 0;
    std::uint64_t forks = 0, execs = 0, uid_drops = 0, close_ranges = 0, eintr = 0;
    std::string pending;
    auto take = [&](const char *buf, std::size_t n) {
        pending.append(buf, n);
        for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
            const std::string line = pending.substr(0, nl);
            std::printf("%s\n", line.c_str());
            std::fflush(stdout);
            if (line.rfind("session", 0) == 0) --running;
            verified += field(line, "verified");
            forks += field(line, "forks");
            execs += field(line, "execs");
            uid_drops += field(line, "uid_drops");
            close_ranges += field(line, "close_ranges");
            eintr += field(line, "eintr");
            if (line.find("result=ok") != std::string::npos) ++ok;
            else if (line.find("result=killed") != std::string::npos) ++killed;
            else if (line.find("result=hang") != std::string::npos) ++hangs;
            else ++errors;
        }
    };
    // False once every writer has closed the pipe.
    auto collect = [&](int timeout_ms) {
        pollfd p{res[0], POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) <= 0) return true;
        char buf[4096];
        const ssize_t n = ::read(res[0], buf, sizeof buf);
        if (n <= 0) return false;
        take(buf, std::size_t(n));
        return true;
    };
    while (started < bytes && now_s() - start < seconds * 0.75) {
        if (running >= procs) {
            collect(100);
            continue;
        }
        const std::uint64_t sseed = splitmix(rng) >> 1;
        std::uint64_t total = (1u << 20) + splitmix(rng) % (64u << 20);
        total = std::min(total, (bytes - started + 1) / 2);
        const double bound = std::max(20.0, seconds - (now_s() - start));
        spawn([=] { return session(sseed, total, actions, bound); });
        started += 2 * total;
        ++sessions;
        ++running;
    }
    // Every process ends within its bound; the results pipe reaches EOF
    // once the last one has (its descendants hold it too).
    ::close(res[1]);
    const double give_up = start + seconds + 120;
    while (collect(1000)) {
        if (now_s() > give_up) {
            std::printf("soak: results still missing %.0f s after the bound\n", now_s() - start - seconds);
            ++hangs;
            for (pid_t k : kids) ::kill(k, SIGKILL);
            break;
        }
    }
    for (pid_t k : kids) ::waitpid(k, nullptr, 0);
    std::printf("summary: sessions=%u ok=%u killed=%u errors=%u hangs=%u bytes_checked=%llu forks=%llu "
                "execs=%llu uid_drops=%llu close_ranges=%llu eintr=%llu seconds=%.0f\n",
                sessions + (clients ? 1 : 0), ok, killed, errors, hangs, (unsigned long long)verified,
                (unsigned long long)forks, (unsigned long long)execs, (unsigned long long)uid_drops,
                (unsigned long long)close_ranges, (unsigned long long)eintr, now_s() - start);
    return errors || hangs ? 1 : 0;
}

}  // namespace
}  // namespace soak

int main(int argc, char **argv) {
    using namespace soak;
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "resume" && argc == 3) {
        Side s;
        if (!decode(argv[2], &s)) return 5;
        run_side(s);
    }
    if (mode == "client" && argc == 5)
        return oneshot_client(static_cast<unsigned short>(std::atoi(argv[2])), std::strtoull(argv[3], nullptr, 10),
                              std::strtoull(argv[4], nullptr, 10));
    // One session again, from the seed and size a soak printed for it
    // (the choices repeat; the timing does not).
    if (mode == "session" && argc == 5) {
        const std::string line = session(std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10),
                                          parse_actions(argv[4]), 120);
        std::printf("%s\n", line.c_str());
        return line.find("result=ok") != std::string::npos || line.find("result=killed") != std::string::npos ? 0 : 1;
    }
    if (mode == "soak") {
        std::uint64_t bytes = 10'000'000'000ull, seed = std::uint64_t(time(nullptr));
        double seconds = 3600;
        unsigned procs = 2, clients = 50, actions = ~0u;
        for (int i = 2; i + 1 < argc; i += 2) {
            const std::string k = argv[i], v = argv[i + 1];
            if (k == "--bytes") bytes = std::strtoull(v.c_str(), nullptr, 10);
            else if (k == "--seconds") seconds = std::atof(v.c_str());
            else if (k == "--procs") procs = unsigned(std::atoi(v.c_str()));
            else if (k == "--clients") clients = unsigned(std::atoi(v.c_str()));
            else if (k == "--actions") actions = parse_actions(v);
            else if (k == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
            else {
                std::fprintf(stderr, "soak-worker: unknown option %s\n", k.c_str());
                return 2;
            }
        }
        return run_soak(bytes, seconds, std::max(1u, procs), clients, actions, seed);
    }
    std::fprintf(stderr,
                 "usage: soak-worker soak [--bytes N] [--seconds T] [--procs P] [--clients K] [--actions LIST] [--seed S]\n"
                 "       soak-worker session SEED BYTES ACTIONS   (one session again)\n"
                 "       actions: all or fork,fork-idle,close-range,exec,stop,kill,setuid,timer,families,sendfile\n");
    return 2;
}
