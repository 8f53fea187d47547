// Children made without the fork handlers: vfork, _Fork, clone, and the
// fork, vfork, clone and clone3 system calls made through syscall(). A
// vfork or clone(CLONE_VM) child runs in this process's memory, the socket
// table included, and a _Fork child with its parent's state: the socket
// calls such a child makes go to the kernel unchanged (foreign_process:
// its pid is not the table's). Telling costs a getpid, a system call, so
// the library asks only once such a child may have been made; each entry
// point here says so (note_unhandled_child) before it goes on to libc's.
//
// Each is a jump, not a call: the real vfork must return to our caller,
// twice, from its own frame, and clone and syscall take variadic
// arguments that are passed on untouched. So the entry points are written
// in assembly (x86-64): they save the argument registers, ask
// sd_unhandled_child for the real function, restore them and jump to it.
// Elsewhere nothing is caught, and foreign_process() asks the kernel at
// every call instead (note_unhandled_child at start-up).
#include "shim.hpp"
#include "shm_fallback/table.hpp"
#include "transport/sys.hpp"

#include <sys/syscall.h>

namespace {

enum Entry : long { kVfork, kFork, kClone, kSyscall };

}  // namespace

// The real function for `entry`; for syscall(), notes a child only for
// the system calls that make one (`number`).
extern "C" __attribute__((visibility("hidden"), used)) void *sd_unhandled_child(long entry,
                                                                                 long number) noexcept {
    using sd::transport::sys;
    sd::transport::resolve_sys();
    void *real = nullptr;
    switch (entry) {
    case kVfork: real = sys.vfork; break;
    case kFork: real = sys.Fork; break;
    case kClone: real = sys.clone; break;
    default: real = sys.syscall; break;
    }
    if (entry != kSyscall || number == SYS_fork || number == SYS_vfork || number == SYS_clone
#ifdef SYS_clone3
        || number == SYS_clone3
#endif
    )
        sd::fallback::note_unhandled_child();
    return real;
}

#if defined(__x86_64__)
// At entry the stack is 8 bytes off 16-byte alignment (the return
// address). vfork and _Fork take no arguments (SD_NO_ARGS): 8 bytes align
// it. clone and syscall pass theirs on (SD_PASSED_ON): the six argument
// registers and %rax (the vector register count of a variadic call) are
// pushed, seven words, which aligns it, and popped before the jump; the
// entry's number, and for syscall the system call's number, go to
// sd_unhandled_child. %r11 is scratch in the calling convention and in
// the system call. The entry numbers are Entry's. SD_ENTRY opens a global
// function of that name (its CFI frame included).
asm(R"(
    .macro SD_ENTRY name
    .text
    .p2align 4
    .globl \name
    .type \name, @function
\name:
    .cfi_startproc
    .endm

    .macro SD_NO_ARGS name, entry
    SD_ENTRY \name
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    movl $\entry, %edi
    xorl %esi, %esi
    call sd_unhandled_child
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    jmp *%rax
    .cfi_endproc
    .size \name, .-\name
    .endm

    .macro SD_PASSED_ON name, entry, number
    SD_ENTRY \name
    pushq %rdi
    pushq %rsi
    pushq %rdx
    pushq %rcx
    pushq %r8
    pushq %r9
    pushq %rax
    .cfi_adjust_cfa_offset 56
    movq \number, %rsi
    movl $\entry, %edi
    call sd_unhandled_child
    movq %rax, %r11
    popq %rax
    popq %r9
    popq %r8
    popq %rcx
    popq %rdx
    popq %rsi
    popq %rdi
    .cfi_adjust_cfa_offset -56
    jmp *%r11
    .cfi_endproc
    .size \name, .-\name
    .endm

    SD_NO_ARGS vfork, 0
    SD_NO_ARGS _Fork, 1
    SD_PASSED_ON clone, 2, $0
    SD_PASSED_ON syscall, 3, %rdi
)");
#else
namespace {
// No entry points to catch these children with: foreign_process() asks
// the kernel at every call, as if such a child had been made.
[[gnu::constructor]] void children_unknown() noexcept { sd::fallback::note_unhandled_child(); }
}  // namespace
#endif
