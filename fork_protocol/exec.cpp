#include "exec.hpp"

#include "handover.hpp"

#include "shm_fallback/table.hpp"
#include "transport/engine.hpp"
#include "transport/sys.hpp"

#include <cstring>

namespace sd::forking {

ExecEnv::ExecEnv(char *const envp[]) noexcept : env_(envp) {
    if (transport::guarded()) return;
    if (fallback::foreign_process()) {
        fallback::table_before_exec();
        return;
    }
    own_ = true;
    fallback::table_exec_drop_uninherited();
    if (!env_preloads_library(envp)) {
        fallback::table_before_exec();
        return;
    }
    const std::size_t n = table_hand_over_for_exec(envp, var_, sizeof var_);
    const std::size_t name = std::strlen(kInheritVar);
    std::size_t count = 0;
    for (char *const *e = envp; e && *e; ++e) ++count;
    // An old one is never passed on, whether or not there is a new one.
    list_.reserve(count + 2);
    for (char *const *e = envp; e && *e; ++e)
        if (std::strncmp(*e, kInheritVar, name) != 0 || (*e)[name] != '=') list_.push_back(*e);
    if (n) list_.push_back(var_);
    list_.push_back(nullptr);
    env_ = list_.data();
    handed_ = n != 0;
}

ExecEnv::~ExecEnv() {
    if (handed_) hand_over_failed();
    if (own_) fallback::table_exec_failed();
}

ExecGate::ExecGate() noexcept
    : closed_(!transport::guarded() && transport::Engine::close_provider()) {}

ExecGate::~ExecGate() {
    if (closed_) transport::Engine::reopen_provider();
}

}  // namespace sd::forking
