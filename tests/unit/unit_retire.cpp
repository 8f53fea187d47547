// A process's retirement (transport/retire.cpp): by a sandbox for the
// rest of its life, by a change of ids until a later change afresh. Each
// case runs in a forked child: the state is the process's own.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/engine.hpp"

using namespace sd::transport;

namespace {

// In a child: exits 1 at the first check that fails.
void check(bool ok) {
    if (!ok) _exit(1);
}

}  // namespace

TEST_CASE("a retirement by a change of ids ends at end_retirement, and a later one comes again",
          "[retire]") {
    CHECK(exited_cleanly(in_child([] {
        check(!retired() && !sandboxed());
        check(!end_retirement());  // nothing to end
        check(set_retired(false));
        check(retired() && !sandboxed());
        check(!set_retired(false));  // once
        check(end_retirement());
        check(!retired());
        check(set_retired(false));
        check(retired());
    })));
}

TEST_CASE("a retirement by a sandbox never ends, whatever came before or after it", "[retire]") {
    CHECK(exited_cleanly(in_child([] {
        check(set_retired(true));
        check(retired() && sandboxed());
        check(!end_retirement());
        check(!set_retired(false));
        check(retired() && sandboxed());
    })));
    CHECK(exited_cleanly(in_child([] {
        check(set_retired(false));
        check(!set_retired(true));  // retired already, now in a sandbox too
        check(sandboxed());
        check(!end_retirement());
        check(retired());
    })));
}

TEST_CASE("a change afresh may begin after a retirement by ids, never in a sandbox",
          "[retire]") {
    CHECK(exited_cleanly(in_child([] {
        check(set_retired(false));
        check(begin_afresh());  // no engine in this process
        check(builds_held());
        end_afresh(false);  // ids mixed: the retirement stays
        check(!builds_held() && retired());
        check(set_retired(true) == false && sandboxed());
        check(!begin_afresh());
        check(!builds_held());
    })));
}
