// Helpers every shim uses: find the stream behind an fd (with a reference
// held for the call) and turn a core result (value or -errno) into the
// libc convention.
#pragma once
#include "shm_fallback/table.hpp"
#include "transport/sys.hpp"

#include <cerrno>
#include <sys/types.h>

#define SD_EXPORT extern "C" __attribute__((visibility("default")))

namespace sd::intercept {

using transport::sys;

// A stream held for the duration of one call; empty when the call must go
// straight to libc (not ours, or made by our own dependencies).
class CallRef {
  public:
    explicit CallRef(int fd) noexcept
        : s_(transport::guarded() ? nullptr : fallback::acquire(fd)) {
        if (s_) s_->calls.fetch_add(1, std::memory_order_acq_rel);
    }
    ~CallRef() {
        if (!s_) return;
        // An ask the call made waits for the socket's plain epoll
        // registrations to become shadows: made now, no lock held.
        if (s_->ask_deferred.load(std::memory_order_relaxed)) s_->finish_deferred_ask();
        if (transport::Conn *c = s_->conn.load(std::memory_order_acquire)) {
            // A call on a direct socket may change its readiness beyond
            // what its connection's counts say (a reset a send found, a
            // shutdown).
            s_->touch(c);
            // Its wait for the peer's upgrade ran out during the call: on
            // TCP for good now, with no lock held (not from a vfork child,
            // whose memory is its parent's).
            if (transport::peer_wait_over(c) && !fallback::foreign_process()) s_->stop_waiting(c);
            // Its upgrade is ours to ask and the peer had not published
            // when we last looked: again, at longer and longer intervals
            // (Engine::ask_later).
            else if (transport::ask_again_due(c) && !fallback::foreign_process())
                s_->ask_again(c);
        }
        // The last call over a socket closed meanwhile: its close now.
        if (s_->calls.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
            s_->held_fd.load(std::memory_order_acquire) >= 0)
            s_->close_held();
        fallback::release(s_);
    }
    CallRef(const CallRef &) = delete;
    CallRef &operator=(const CallRef &) = delete;
    explicit operator bool() const noexcept { return s_ != nullptr; }
    fallback::Stream *operator->() const noexcept { return s_; }
    fallback::Stream *get() const noexcept { return s_; }

  private:
    fallback::Stream *s_;
};

// Calls that change the socket table go straight to libc in our own
// dependencies and in a vfork child (whose memory is its parent's).
inline bool table_frozen() noexcept {
    return transport::guarded() || fallback::foreign_process();
}

// errno back as the kernel's call left it, after work of ours that may
// have changed it: written only if it did. errno lives on a page of the
// thread's own variables, and after a fork the first write to a page the
// child still shares copies it (a page fault): a forking server's accept
// would pay one per connection for a value already there.
inline void keep_errno(int err) noexcept {
    if (errno != err) errno = err;
}

template <typename T>
inline T ret(T r) noexcept {
    if (r < 0) {
        errno = int(-r);
        return T(-1);
    }
    return r;
}

}  // namespace sd::intercept
