// Entry point of the behaviour suite. Exits 77 (meson's SKIP) when every
// selected test case skipped, so a missing library or capability never
// shows up as a pass.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <cstdio>

namespace {

struct SkipCounter : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    void testCaseStarting(Catch::TestCaseInfo const &) override { sdt::case_started(); }
    void testCaseEnded(Catch::TestCaseStats const &) override { sdt::case_ended(); }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipCounter)

int main(int argc, char **argv) {
    std::printf("configuration: %s\n", sdt::config_name());
    Catch::Session session;
    int rc = session.run(argc, argv);
    if (rc == 0 && sdt::all_skipped()) {
        std::printf("every selected behaviour was skipped\n");
        return 77;
    }
    return rc;
}
