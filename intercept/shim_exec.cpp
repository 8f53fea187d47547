// Starting programs in place: the exec family. The new program may not
// run the library (or runs a fresh copy that knows nothing of our
// connections), so every socket it inherits goes back to the kernel
// first: for good, unless the exec replaces this process with a program
// whose environment preloads the library; then the connections are
// handed over (fork_protocol/handover.hpp) and the new image may upgrade
// them again. glibc's own calls between these entry points are internal
// and not interposable: each public one is caught. vfork needs nothing of
// its own: its child reaches exec through here. Programs started in a
// child (posix_spawn, system, popen): shim_spawn.cpp.
#include "shim.hpp"
#include "fork_protocol/handover.hpp"
#include "transport/engine.hpp"
#include "transport/log.hpp"

#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

extern char **environ;

using sd::transport::sys;

namespace {

// The environment of an exec in place: `envp` itself, after every
// inherited socket went back to the kernel for good; or, when `envp`
// preloads the library, `envp` with the hand-over of the connections
// that could be handed over (SDIRECT_INHERIT) and for good for the rest.
// Never in a vfork child (its memory and fds are its parent's): there the
// sockets go for good.
class ExecEnv {
  public:
    explicit ExecEnv(char *const envp[]) noexcept : env_(envp) {
        if (sd::transport::guarded()) return;
        if (sd::fallback::foreign_process()) {
            sd::fallback::table_before_exec();
            return;
        }
        own_ = true;
        sd::fallback::table_exec_drop_uninherited();
        if (!sd::forking::env_preloads_library(envp)) {
            sd::fallback::table_before_exec();
            return;
        }
        const std::size_t n = sd::forking::table_hand_over_for_exec(envp, var_, sizeof var_);
        const std::size_t name = std::strlen(sd::forking::kInheritVar);
        std::size_t count = 0;
        for (char *const *e = envp; e && *e; ++e) ++count;
        // An old one is never passed on, whether or not there is a new one.
        list_.reserve(count + 2);
        for (char *const *e = envp; e && *e; ++e)
            if (std::strncmp(*e, sd::forking::kInheritVar, name) != 0 || (*e)[name] != '=')
                list_.push_back(*e);
        if (n) list_.push_back(var_);
        list_.push_back(nullptr);
        env_ = list_.data();
        handed_ = n != 0;
    }
    // Only reached when the exec failed.
    ~ExecEnv() {
        if (handed_) sd::forking::hand_over_failed();
        if (own_) sd::fallback::table_exec_failed();
    }
    ExecEnv(const ExecEnv &) = delete;
    ExecEnv &operator=(const ExecEnv &) = delete;
    char *const *get() const noexcept { return env_; }

  private:
    char *const *env_;
    bool handed_ = false;
    bool own_ = false;  // not a vfork child: holder entries were dropped
    char var_[8192];
    std::vector<char *> list_;
};

// An exec of this process: once its sockets left (ExecEnv), no other thread may enter the
// provider until the new image replaces them all; reopened if exec fails.
struct ExecGate {
    bool closed = !sd::transport::guarded() && sd::transport::Engine::close_provider_for_exec();
    ~ExecGate() {
        if (closed) sd::transport::Engine::reopen_provider();
    }
};

// execl and friends: the arguments after `first` up to the terminating
// null pointer, as an argv; `envp` gets what follows it (execle).
std::vector<char *> gather(const char *first, va_list ap, char ***envp) {
    std::vector<char *> argv{const_cast<char *>(first)};
    while (char *a = va_arg(ap, char *)) argv.push_back(a);
    argv.push_back(nullptr);
    if (envp) *envp = va_arg(ap, char **);
    return argv;
}

}  // namespace

SD_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    ExecEnv env(envp);
    ExecGate gate;
    return sys.execve(path, argv, env.get());
}

SD_EXPORT int execv(const char *path, char *const argv[]) {
    ExecEnv env(environ);
    ExecGate gate;
    return sys.execve(path, argv, env.get());
}

SD_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    ExecEnv env(envp);
    ExecGate gate;
    return sys.execvpe(file, argv, env.get());
}

SD_EXPORT int execvp(const char *file, char *const argv[]) {
    ExecEnv env(environ);
    ExecGate gate;
    return sys.execvpe(file, argv, env.get());
}

SD_EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
    ExecEnv env(envp);
    ExecGate gate;
    return sys.fexecve(fd, argv, env.get());
}

SD_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
                       int flags) {
    ExecEnv env(envp);
    ExecGate gate;
    return sys.execveat(dirfd, path, argv, env.get(), flags);
}

SD_EXPORT int execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    std::vector<char *> argv = gather(arg, ap, nullptr);
    va_end(ap);
    return execv(path, argv.data());
}

SD_EXPORT int execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    std::vector<char *> argv = gather(arg, ap, nullptr);
    va_end(ap);
    return execvp(file, argv.data());
}

SD_EXPORT int execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    char **envp = nullptr;
    std::vector<char *> argv = gather(arg, ap, &envp);
    va_end(ap);
    return execve(path, argv.data(), envp);
}
