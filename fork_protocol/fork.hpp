// fork() for now: a child never uses its parent's fabric endpoint, engine
// or connection state. Inherited connected sockets stay with the kernel in
// the child (the parent keeps them direct); sockets the child creates or
// accepts afterwards get the child's own engine, built on first use.
#pragma once

namespace sd::forking {

// Registers the pthread_atfork handlers (library constructor).
void install() noexcept;

}  // namespace sd::forking
