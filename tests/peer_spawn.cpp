// A program started in a child while this process keeps its connection:
// posix_spawn, system, popen, vfork and exec (drive_spawn_child), and that
// program (mode spawn-child). The child is this same program; it inherits the
// environment, so under the library it runs the library too.
#include "peer_common.hpp"
#include "peer_drivers.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <spawn.h>
#include <string>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace peer {

namespace {

constexpr std::uint64_t kChildBytes = 300000;

std::string self_path() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) fail("readlink /proc/self/exe: %s", errno_name(errno));
    return std::string(buf, std::size_t(n));
}

void check_status(int status, const char *what) {
    if (status == -1) fail("%s: %s", what, errno_name(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("%s: the child ended with status 0x%x", what, unsigned(status));
}

// Both ways, checked: an echo round and 1 MiB each way.
void exchange(int fd, const Options &opt, std::uint64_t first) {
    echo_round(fd, fd, 65536, seed_of(opt, first));
    Cmd down;
    down.op = Op::send;
    down.api = std::uint32_t(Tx::send);
    down.size = 1 << 20;
    down.seed = seed_of(opt, first + 2);
    send_cmd(fd, down);
    recv_pattern(fd, Rx::recv, down.seed, down.size, 65536, "bulk from the responder");
    Cmd up;
    up.op = Op::recv;
    up.api = std::uint32_t(Rx::recv);
    up.size = 1 << 20;
    up.seed = seed_of(opt, first + 3);
    send_cmd(fd, up);
    send_pattern(fd, Tx::send, up.seed, up.size, 65536, 0);
    expect_ack(fd, "ack of the bulk to the responder");
}

}  // namespace

// --via spawn|system|popen|vfork|vfork-moved|syscall-fork|_Fork|clone-vm;
// vfork-moved: the vfork child moves the socket to fd 700 (dup2, close)
// before its exec, so its fds differ from the parent's table; the last
// three make a child without the fork handlers (the fork system call
// through syscall(), glibc's _Fork, clone with CLONE_VM|CLONE_VFORK) that
// closes the socket and exits without an exec: its close must leave the
// parent's connection as it is (--child cloexec only). --child:
//   cloexec    the socket has FD_CLOEXEC; the child checks it lacks it
//   closed     inheritable, posix_spawn's addclose takes it from the child
//   dup2-over  inheritable, posix_spawn's adddup2 puts /dev/null on its fd
//   closefrom  inheritable, posix_spawn's addclosefrom_np(3) closes it
//   writes     inheritable; the child sends kChildBytes of pattern on it,
//              which the responder checks and acknowledges
//   copied     close-on-exec, but adddup2'ed to fd 700 in an action list
//              that is copied (a struct copy) and spawned from the copy,
//              whose actions the library never saw; the child writes as
//              for `writes`, on fd 700
// --ballast N: first, N inheritable Unix sockets (socketpairs), and the
// connection moved to an fd above them (F_DUPFD from 700): the child
// inherits more sockets than a new program's list holds at once (256).
// Before and after the child: exchange() both ways. The "child" line gives
// the bytes this process had moved when the child started.
void drive_spawn_child(int *fd, const Options &opt) {
    std::vector<int> ballast;
    for (std::uint64_t i = 0, n = opt.num("ballast", 0); i < n; i += 2) {
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) fail("socketpair: %s", errno_name(errno));
        ballast.insert(ballast.end(), {sp[0], sp[1]});
    }
    if (!ballast.empty()) {
        const int high = fcntl(*fd, F_DUPFD, 700);
        if (high < 0) fail("fcntl(F_DUPFD, 700): %s", errno_name(errno));
        close(*fd);
        *fd = high;
    }
    const int s = *fd;
    const std::string via = opt.get("via", "spawn");
    const std::string child = opt.get("child", "cloexec");
    const bool closes = via == "syscall-fork" || via == "_Fork" || via == "clone-vm";
    if (via != "spawn" && via != "system" && via != "popen" && via != "vfork" &&
        via != "vfork-moved" && !closes)
        fail("--via must be spawn, system, popen, vfork, vfork-moved, syscall-fork, _Fork or "
             "clone-vm");
    if (closes && child != "cloexec") fail("--via %s needs --child cloexec", via.c_str());
    const bool by_actions =
        child == "closed" || child == "dup2-over" || child == "closefrom" || child == "copied";
    const bool writes = child == "writes" || child == "copied";
    if (child != "cloexec" && child != "writes" && !by_actions)
        fail("unknown --child '%s'", child.c_str());
    if (by_actions && via != "spawn") fail("--child %s needs --via spawn", child.c_str());
    exchange(s, opt, 0);
    if (fcntl(s, F_SETFD, child == "cloexec" || child == "copied" ? FD_CLOEXEC : 0) != 0)
        fail("fcntl(F_SETFD): %s", errno_name(errno));
    const std::uint64_t seed = seed_of(opt, 20);
    if (writes) {
        Cmd cmd;
        cmd.op = Op::recv;
        cmd.api = std::uint32_t(Rx::recv);
        cmd.size = kChildBytes;
        cmd.seed = seed;
        send_cmd(s, cmd);
    }
    note("child pid=%d local=%s peer=%s tx=%llu rx=%llu", int(getpid()), local_text(s).c_str(),
         peer_text(s).c_str(), (unsigned long long)counted_tx(s),
         (unsigned long long)counted_rx(s));
    const std::string self = self_path();
    const std::string fd_text =
        std::to_string(child == "copied" || via == "vfork-moved" ? 700 : s);
    const std::string seed_text = std::to_string(seed);
    const std::string local = local_text(s);
    std::vector<std::string> args = {self, "spawn-child", "--fd", fd_text, "--local", local};
    if (writes)
        args.insert(args.end(), {"--seed", seed_text, "--size", std::to_string(kChildBytes)});
    if (via == "spawn") {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        int null_fd = -1;
        if (child == "closed") posix_spawn_file_actions_addclose(&fa, s);
        if (child == "closefrom") posix_spawn_file_actions_addclosefrom_np(&fa, 3);
        if (child == "dup2-over") {
            null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (null_fd < 0) fail("open /dev/null: %s", errno_name(errno));
            posix_spawn_file_actions_adddup2(&fa, null_fd, s);
        }
        if (child == "copied") posix_spawn_file_actions_adddup2(&fa, s, 700);
        const posix_spawn_file_actions_t copy = fa;
        std::vector<char *> argv;
        for (std::string &a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_t pid = -1;
        std::fflush(stdout);
        const int rc = posix_spawn(&pid, self.c_str(), child == "copied" ? &copy : &fa, nullptr,
                                   argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (null_fd >= 0) close(null_fd);
        if (rc != 0) fail("posix_spawn: %s", errno_name(rc));
        reap(pid, "the spawned child");
    } else if (via == "vfork" || via == "vfork-moved") {
        std::vector<char *> argv;
        for (std::string &a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        std::fflush(stdout);
        static bool moved;  // static: kept across vfork's two returns
        moved = via == "vfork-moved";
        const pid_t pid = vfork();
        if (pid < 0) fail("vfork: %s", errno_name(errno));
        if (pid == 0) {
            if (moved && (dup2(s, 700) != 700 || close(s) != 0)) _exit(126);
            execve(self.c_str(), argv.data(), environ);
            _exit(127);
        }
        reap(pid, "the spawned child");
    } else if (closes) {
        std::fflush(stdout);
        pid_t pid = -1;
        if (via == "clone-vm") {
            constexpr std::size_t kStack = 1 << 16;
            void *stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
            if (stack == MAP_FAILED) fail("mmap: %s", errno_name(errno));
            static int closing;
            closing = s;
            pid = clone([](void *) -> int { return close(closing) == 0 ? 0 : 125; },
                        static_cast<char *>(stack) + kStack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                        nullptr);
            if (pid < 0) fail("clone: %s", errno_name(errno));
            reap(pid, "the clone(CLONE_VM) child");
            munmap(stack, kStack);
        } else {
            pid = via == "_Fork" ? _Fork() : pid_t(syscall(SYS_fork));
            if (pid < 0) fail("%s: %s", via.c_str(), errno_name(errno));
            if (pid == 0) _exit(close(s) == 0 ? 0 : 125);
            reap(pid, "the child without fork handlers");
        }
    } else {
        // Through the shell: arguments without spaces or quotes.
        std::string command;
        for (const std::string &a : args) {
            if (a.find_first_of(" '\"\\$`[]*?") != std::string::npos)
                fail("argument '%s' needs quoting", a.c_str());
            command += (command.empty() ? "" : " ") + a;
        }
        std::fflush(stdout);
        if (via == "system") {
            check_status(system(command.c_str()), "system");
        } else {
            FILE *p = popen((command + " --say done").c_str(), "r");
            if (!p) fail("popen: %s", errno_name(errno));
            char line[64] = {};
            const bool got = std::fgets(line, sizeof line, p) != nullptr;
            check_status(pclose(p), "popen");
            if (!got || std::strcmp(line, "done\n") != 0)
                fail("popen: read '%s' from the child's stdout, not 'done'", got ? line : "(EOF)");
        }
    }
    if (writes) expect_ack(s, "ack of the child's bytes");
    exchange(s, opt, 40);
    for (int b : ballast) close(b);
}

// Mode spawn-child: --fd N is the parent's socket, --local its local
// address. With --size and --seed: send that much pattern on it. Without:
// fd N must not be that socket here. --say TEXT: print it on stdout.
int run_spawn_child(const Options &opt) {
    const int fd = int(opt.num("fd", 1000000));
    const std::string local = opt.get("local");
    const std::uint64_t size = opt.num("size", 0);
    if (size) {
        if (local_text(fd) != local) fail("fd %d here is not the parent's socket", fd);
        send_pattern(fd, Tx::send, opt.num("seed", 0), size, 65536, 0);
    } else {
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && local_text(fd) == local)
            fail("fd %d reached the child", fd);
    }
    if (opt.has("say")) std::printf("%s\n", opt.get("say").c_str());
    return 0;
}

}  // namespace peer
