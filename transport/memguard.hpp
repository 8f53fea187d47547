// Copies between the application's buffers and ours that fail like the
// kernel's copy_to_user/copy_from_user instead of crashing: a bad pointer
// passed to recv or send gets EFAULT, as it would on TCP, and no byte of
// the stream is consumed or sent.
//
// How: a SIGSEGV/SIGBUS handler, installed once when the engine is built
// and only if the application has none, jumps back out of a guarded copy.
// A fault anywhere else goes on to the disposition that was there before
// (the default action: the process dies of the signal as it would have).
// Without the handler (the application installed its own first) copies
// run unguarded, exactly as plain memcpy.
#pragma once
#include <csetjmp>
#include <cstddef>
#include <sys/uio.h>

namespace sd::transport {

void memguard_install() noexcept;

namespace detail {
extern bool memguard_on;
extern thread_local sigjmp_buf *memguard_jump;
}  // namespace detail

// Runs fn(); false if it touched an unmapped or protected page. (Not
// sys.hpp's guarded(), the re-entrancy guard.)
template <class F>
bool fault_guarded(F &&fn) noexcept {
    if (!detail::memguard_on) {
        fn();
        return true;
    }
    sigjmp_buf env;
    if (sigsetjmp(env, 0)) return false;  // the handler cleared memguard_jump
    detail::memguard_jump = &env;
    asm volatile("" ::: "memory");
    fn();
    asm volatile("" ::: "memory");
    detail::memguard_jump = nullptr;
    return true;
}

// Probes (always true without the handler: the real access then faults
// as plain code would). Every page of the range can be read / written.
bool readable(const void *p, std::size_t len) noexcept;
bool writable(void *p, std::size_t len) noexcept;
// The first `len` bytes of iov can be read.
bool readable_iov(const iovec *iov, int iovcnt, std::size_t len) noexcept;

}  // namespace sd::transport
