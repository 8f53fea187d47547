// Starting programs in place: the exec family. The new program may not
// run the library (or runs a fresh copy that knows nothing of our
// connections), so every socket it inherits goes back to the kernel
// first: for good, unless the exec replaces this process with a program
// whose environment preloads the library; then the connections are
// handed over (handover.hpp) and the new image may upgrade them again.
// vfork needs nothing of its own: its child reaches exec through here.
#pragma once
#include <cstddef>
#include <vector>

namespace sd::forking {

// The environment of an exec in place, made before the call: `envp`
// itself, after every inherited socket went back to the kernel for good;
// or, when `envp` preloads the library, `envp` with the hand-over of the
// connections that could be handed over (SDIRECT_INHERIT) and for good
// for the rest. Never in a vfork child (its memory and fds are its
// parent's): there the sockets go for good, and nothing is allocated.
// Destroyed only when the exec failed: what was prepared is undone.
class ExecEnv {
  public:
    explicit ExecEnv(char *const envp[]) noexcept;
    ~ExecEnv();
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

// An exec of this process: once its sockets left (ExecEnv), no other
// thread may enter the provider until the new image replaces them all;
// reopened if the exec fails.
class ExecGate {
  public:
    ExecGate() noexcept;
    ~ExecGate();
    ExecGate(const ExecGate &) = delete;
    ExecGate &operator=(const ExecGate &) = delete;

  private:
    bool closed_ = false;
};

}  // namespace sd::forking
