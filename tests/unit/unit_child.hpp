// A check that must end its process (a checked build's abort on a
// violation): run in a forked child, with SIGABRT at its default and
// stderr closed (the violation's message is expected).
#pragma once
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

// Runs `body` in a child; returns its wait status.
template <class F>
int in_child(F body) {
    pid_t pid = fork();
    if (pid == 0) {
        std::signal(SIGABRT, SIG_DFL);
        close(2);
        body();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

// in_child's status: the body returned, or it aborted.
inline bool exited_cleanly(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }
inline bool aborted(int st) { return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT; }
