// The text of the counters: one line per connection and one per process,
// as SDIRECT_STATS_FILE, sdirect-stat and the log show them. Built without
// allocation, locks or stdio, so that a process dying of a signal can
// still write its lines from the signal handler.
#include "procpage.hpp"

#include <sys/socket.h>

namespace sd::transport {

namespace {

// Appends to a fixed buffer; what does not fit is cut (the line stays
// NUL-terminated).
struct Out {
    char *p;
    std::size_t left;  // room, the terminating NUL included

    void ch(char c) noexcept {
        if (left > 1) {
            *p++ = c;
            --left;
        }
        *p = '\0';
    }
    void str(const char *s) noexcept {
        while (*s) ch(*s++);
    }
    void u64(unsigned long long v) noexcept {
        char d[24];
        int n = 0;
        do d[n++] = char('0' + v % 10);
        while ((v /= 10) != 0);
        while (n) ch(d[--n]);
    }
    void i64(long long v) noexcept {
        if (v < 0) {
            ch('-');
            u64(0ull - (unsigned long long)v);
        } else {
            u64((unsigned long long)v);
        }
    }
    void hex(unsigned v) noexcept {
        static constexpr char digits[] = "0123456789abcdef";
        char d[8];
        int n = 0;
        do d[n++] = digits[v & 15];
        while ((v >>= 4) != 0);
        while (n) ch(d[--n]);
    }
    void kv(const char *key, unsigned long long v) noexcept {
        ch(' ');
        str(key);
        ch('=');
        u64(v);
    }
};

void v4(Out &o, const std::uint8_t *a) noexcept {
    for (int i = 0; i < 4; ++i) {
        if (i) o.ch('.');
        o.u64(a[i]);
    }
}

// As inet_ntop writes it: lower-case groups without leading zeros, the
// first longest run of two or more zero groups as "::", and the IPv4
// forms (::a.b.c.d, ::ffff:a.b.c.d) in dotted quads.
void v6(Out &o, const std::uint8_t *a) noexcept {
    unsigned w[8];
    for (int i = 0; i < 8; ++i) w[i] = unsigned(a[2 * i]) << 8 | a[2 * i + 1];
    int best = -1, best_len = 0;
    for (int i = 0; i < 8;) {
        if (w[i]) {
            ++i;
            continue;
        }
        int j = i;
        while (j < 8 && !w[j]) ++j;
        if (j - i > best_len) best = i, best_len = j - i;
        i = j;
    }
    if (best_len < 2) best = -1;
    for (int i = 0; i < 8; ++i) {
        if (best >= 0 && i >= best && i < best + best_len) {
            if (i == best) o.ch(':');
            continue;
        }
        if (i) o.ch(':');
        if (i == 6 && best == 0 &&
            (best_len == 6 || (best_len == 7 && w[7] != 1) || (best_len == 5 && w[5] == 0xffff))) {
            v4(o, a + 12);
            return;
        }
        o.hex(w[i]);
    }
    if (best >= 0 && best + best_len == 8) o.ch(':');
}

void endpoint(Out &o, std::uint16_t family, const std::uint8_t *addr, std::uint16_t port) noexcept {
    if (family == AF_INET6) {
        o.ch('[');
        v6(o, addr);
        o.ch(']');
    } else {
        v4(o, addr);
    }
    o.ch(':');
    o.u64(port);
}

const char *state_name(std::uint32_t s) noexcept {
    return s == std::uint32_t(SlotState::live) ? "live" : "closed";
}

template <typename T>
unsigned long long get(const std::atomic<T> &a) noexcept {
    return (unsigned long long)a.load(std::memory_order_relaxed);
}

}  // namespace

std::size_t format_endpoints(char *buf, std::size_t n, const ConnStat &s) noexcept {
    if (!n) return 0;
    Out o{buf, n};
    *buf = '\0';
    endpoint(o, s.family, s.local_addr, s.local_port);
    o.str(" > ");
    endpoint(o, s.family, s.peer_addr, s.peer_port);
    return std::size_t(o.p - buf);
}

std::size_t format_conn_into(char *buf, std::size_t n, int pid, const char *comm,
                             const ConnStat &s) noexcept {
    if (!n) return 0;
    Out o{buf, n};
    *buf = '\0';
    o.str("pid=");
    o.i64(pid);
    o.str(" comm=");
    o.str(comm);
    o.str(" fd=");
    o.i64(s.fd);
    o.str(" state=");
    o.str(state_name(s.state.load(std::memory_order_acquire)));
    o.str(" mode=");
    o.str(mode_name(Mode(s.mode.load(std::memory_order_relaxed))));
    o.str(" reason=");
    o.str(reason_name(Reason(s.reason.load(std::memory_order_relaxed))));
    o.str(" local=");
    endpoint(o, s.family, s.local_addr, s.local_port);
    o.str(" peer=");
    endpoint(o, s.family, s.peer_addr, s.peer_port);
    o.str(" peer_pid=");
    o.i64(s.peer_pid);
    o.kv("tx_kernel", get(s.tx_kernel));
    o.kv("rx_kernel", get(s.rx_kernel));
    o.kv("tx_fabric", get(s.tx_fabric));
    o.kv("rx_fabric", get(s.rx_fabric));
    o.kv("tx_msgs", get(s.tx_msgs));
    o.kv("rx_msgs", get(s.rx_msgs));
    o.str(" tx_window=");
    o.i64(s.tx_window.load(std::memory_order_relaxed));
    o.kv("rx_queued", get(s.rx_queued));
    o.kv("rx_owed", get(s.rx_owed));
    o.kv("tx_inline", get(s.tx_inline));
    o.kv("tx_ring", get(s.tx_ring));
    o.kv("tx_zcopy", get(s.tx_zcopy));
    o.kv("rx_zcopy", get(s.rx_zcopy));
    o.kv("tx_sink", get(s.tx_sink));
    o.kv("rx_sink", get(s.rx_sink));
    o.kv("adverts", get(s.adverts));
    o.kv("cancels", get(s.cancels));
    o.kv("sinks", get(s.sinks));
    o.kv("sink_cancels", get(s.sink_cancels));
    o.kv("upgrades", get(s.upgrades));
    o.kv("leaves", get(s.leaves));
    o.str(" peer_reason=");
    o.str(reason_name(Reason(s.peer_reason)));
    return std::size_t(o.p - buf);
}

std::size_t format_process_into(char *buf, std::size_t n, const ProcHeader &h) noexcept {
    if (!n) return 0;
    Out o{buf, n};
    *buf = '\0';
    o.str("process pid=");
    o.i64(h.pid);
    char comm[sizeof h.comm + 1];
    for (std::size_t i = 0; i < sizeof h.comm; ++i) comm[i] = h.comm[i];
    comm[sizeof h.comm] = '\0';
    o.str(" comm=");
    o.str(comm);
    o.str(" reg_cache=");
    o.str(h.reg_cache_on.load(std::memory_order_relaxed) ? "on" : "off");
    o.kv("reg_budget", h.reg_budget);
    o.kv("reg_hits", get(h.reg_hits));
    o.kv("reg_misses", get(h.reg_misses));
    o.kv("reg_invalidated", get(h.reg_invalidated));
    o.kv("reg_evicted", get(h.reg_evicted));
    o.kv("reg_bytes", get(h.reg_bytes));
    o.kv("peers_attached", get(h.peers_attached));
    o.kv("peer_reuses", get(h.peer_reuses));
    o.kv("peers_evicted", get(h.peers_evicted));
    o.kv("peers_gone", get(h.peers_gone));
    return std::size_t(o.p - buf);
}

std::string format_conn(int pid, const char *comm, const ConnStat &s) {
    char line[kStatLineMax];
    std::size_t n = format_conn_into(line, sizeof line, pid, comm, s);
    return std::string(line, n);
}

}  // namespace sd::transport
