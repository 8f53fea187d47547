// The pthread_atfork handlers: a child never uses its parent's fabric
// endpoint, engine or connection state. Before the fork every connected
// socket is marked shared (share.cpp); in the child, inherited sockets
// start on the kernel, and one direct in the parent is claimed at its
// first use here, its owner leaving the fabric (claim.cpp). Sockets the
// child creates or accepts afterwards get the child's own engine, built on
// first use.
#pragma once

namespace sd::forking {

// Installs the fork protocol's hooks into shm_fallback (fork_hooks.hpp)
// and registers the pthread_atfork handlers (library constructor).
void install() noexcept;

}  // namespace sd::forking
