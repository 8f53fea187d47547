#include "memguard.hpp"

#include <csignal>
#include <cstdint>

namespace sd::transport {
namespace detail {
bool memguard_on = false;
thread_local sigjmp_buf *memguard_jump = nullptr;
}  // namespace detail

namespace {

struct sigaction before_segv, before_bus;

void on_fault(int sig, siginfo_t *info, void *uctx) {
    if (sigjmp_buf *j = detail::memguard_jump) {
        detail::memguard_jump = nullptr;
        siglongjmp(*j, 1);
    }
    const struct sigaction &was = sig == SIGSEGV ? before_segv : before_bus;
    if ((was.sa_flags & SA_SIGINFO) && was.sa_sigaction) {
        was.sa_sigaction(sig, info, uctx);
        return;
    }
    if (!(was.sa_flags & SA_SIGINFO) && was.sa_handler != SIG_DFL && was.sa_handler != SIG_IGN) {
        was.sa_handler(sig);
        return;
    }
    // Default action: put it back; the faulting instruction runs again and
    // the process dies of the signal, with a core if so configured.
    signal(sig, SIG_DFL);
}

}  // namespace

void memguard_install() noexcept {
    if (detail::memguard_on) return;
    struct sigaction now_segv {}, now_bus {};
    sigaction(SIGSEGV, nullptr, &now_segv);
    sigaction(SIGBUS, nullptr, &now_bus);
    auto is_default = [](const struct sigaction &a) {
        return !(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_DFL;
    };
    if (!is_default(now_segv) || !is_default(now_bus)) return;  // the application's
    before_segv = now_segv;
    before_bus = now_bus;
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    // SA_NODEFER: the jump leaves the handler without restoring the mask.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    detail::memguard_on = true;
}

namespace {

// One byte per page, and the last byte.
template <class Touch>
void each_page(std::uintptr_t a, std::size_t n, Touch touch) {
    if (!n) return;
    const std::uintptr_t end = a + n;
    for (std::uintptr_t q = a; q < end; q = (q | 4095) + 1) touch(q);
    touch(end - 1);
}

void touch_read(std::uintptr_t q) { (void)*reinterpret_cast<const volatile char *>(q); }
// An atomic no-op write: faults on read-only memory, changes nothing.
void touch_write(std::uintptr_t q) { __atomic_fetch_or(reinterpret_cast<char *>(q), 0, __ATOMIC_RELAXED); }

}  // namespace

bool readable(const void *p, std::size_t len) noexcept {
    if (!detail::memguard_on) return true;
    return fault_guarded([&] { each_page(reinterpret_cast<std::uintptr_t>(p), len, touch_read); });
}

bool writable(void *p, std::size_t len) noexcept {
    if (!detail::memguard_on) return true;
    return fault_guarded([&] { each_page(reinterpret_cast<std::uintptr_t>(p), len, touch_write); });
}

bool readable_iov(const iovec *iov, int iovcnt, std::size_t len) noexcept {
    if (!detail::memguard_on) return true;
    return fault_guarded([&] {
        std::size_t left = len;
        for (int i = 0; i < iovcnt && left; ++i) {
            std::size_t n = iov[i].iov_len < left ? iov[i].iov_len : left;
            each_page(reinterpret_cast<std::uintptr_t>(iov[i].iov_base), n, touch_read);
            left -= n;
        }
    });
}

}  // namespace sd::transport
