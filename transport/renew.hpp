// Around fork: in the child, what the parent's threads may have left
// (locks taken, calls counted, lists of their waits) is set anew; in the
// parent's handlers, what a fork decides is recorded. A fork copies every
// page written after it, in the child as in the parent, and a parent's
// page written by the next fork's handlers faults once more, so what is
// already as it should be is not written: the child of a forking server
// copies no page of ours that it would only have reset.
#pragma once
#include <atomic>
#include <cstring>
#include <new>
#include <type_traits>

namespace sd::transport {

// Made anew unless it is byte for byte a new one (an unlocked mutex).
template <typename T>
void renew(T &obj) noexcept {
    alignas(T) unsigned char fresh[sizeof(T)];
    ::new (static_cast<void *>(fresh)) T();
    if (std::memcmp(fresh, static_cast<const void *>(&obj), sizeof(T)) != 0)
        ::new (static_cast<void *>(&obj)) T();
}

// `var = value`, written only if it differs.
template <typename T>
void renew(T &var, const std::type_identity_t<T> &value) noexcept {
    if (!(var == value)) var = value;
}
template <typename T>
void renew(std::atomic<T> &var, std::type_identity_t<T> value) noexcept {
    if (var.load(std::memory_order_relaxed) != value) var.store(value, std::memory_order_relaxed);
}

}  // namespace sd::transport
