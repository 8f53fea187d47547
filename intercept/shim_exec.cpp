// Starting programs in place: the exec family (fork_protocol/exec.hpp:
// the inherited sockets go back to the kernel, or are handed over to a
// new image that runs the library). glibc's own calls between these entry
// points are internal and not interposable: each public one is caught.
// Programs started in a child (posix_spawn, system, popen): shim_spawn.cpp.
#include "shim.hpp"
#include "fork_protocol/exec.hpp"

#include <cstdarg>
#include <vector>

extern char **environ;

using sd::forking::ExecEnv;
using sd::forking::ExecGate;
using sd::transport::sys;

namespace {

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
