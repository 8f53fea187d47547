// Settings: every one declared with its help text, parsed from the
// environment, and bad values falling back to the defaults.
#include <catch2/catch.hpp>

#include "unit_env.hpp"

#include "transport/settings.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

using namespace sd::transport;

namespace {

// What `f` writes to stderr (fd 2), through a temporary file.
std::string stderr_of(void (*f)()) {
    std::fflush(stderr);
    FILE *tmp = std::tmpfile();
    REQUIRE(tmp);
    const int saved = dup(2);
    dup2(fileno(tmp), 2);
    f();
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string text;
    std::rewind(tmp);
    for (int ch; (ch = std::fgetc(tmp)) != EOF;) text += char(ch);
    std::fclose(tmp);
    return text;
}

}  // namespace

TEST_CASE("every setting has a name, a default and help text") {
    std::size_t n = 0;
    const Setting *t = setting_table(&n);
    REQUIRE(n == std::size_t(Key::count_));
    for (std::size_t i = 0; i < n; ++i) {
        CHECK(std::strncmp(t[i].name, "SDIRECT_", 8) == 0);
        CHECK(t[i].fallback != nullptr);
        CHECK(std::strlen(t[i].help) > 20);
    }
}

TEST_CASE("settings fall back to defaults on bad values") {
    EnvGuard w("SDIRECT_WINDOW", "lots");
    EnvGuard l("SDIRECT_LOG", "loud");
    EnvGuard e("SDIRECT_ENABLE", "maybe");
    load_settings();
    CHECK(settings().window == 2097152);
    CHECK(settings().log == 0);
    CHECK(settings().enable);
}

TEST_CASE("settings parse numbers, booleans and log level names") {
    EnvGuard w("SDIRECT_WINDOW", "0x10000");
    EnvGuard l("SDIRECT_LOG", "info");
    EnvGuard e("SDIRECT_SAME_PROCESS", "off");
    EnvGuard r("SDIRECT_REGISTRY", "/tmp/some-registry");
    load_settings();
    CHECK(settings().window == 65536);
    CHECK(settings().log == 2);
    CHECK_FALSE(settings().same_process);
    CHECK(std::string(settings().registry) == "/tmp/some-registry");
}

TEST_CASE("cross-user connections are on by default, off with 0, and only with the default registry") {
    load_settings();
    CHECK(settings().cross_user);
    {
        EnvGuard x("SDIRECT_CROSS_USER", "0");
        load_settings();
        CHECK_FALSE(settings().cross_user);
    }
    {
        // The other uid's registry is found by its default name only.
        EnvGuard r("SDIRECT_REGISTRY", "/tmp/some-registry");
        load_settings();
        CHECK_FALSE(settings().cross_user);
    }
    load_settings();
}

TEST_CASE("the default registry is per user") {
    load_settings();
    CHECK(std::string(settings().registry) == "/dev/shm/sdirect-" + std::to_string(getuid()));
}

TEST_CASE("the library's own queues carry every pair by default; cross keeps one uid's pairs on the provider's") {
    load_settings();
    CHECK(settings().queues_all);
    {
        EnvGuard q("SDIRECT_QUEUES", "cross");
        load_settings();
        CHECK_FALSE(settings().queues_all);
    }
    {
        EnvGuard q("SDIRECT_QUEUES", "some");  // not a value: the default
        const std::string said = stderr_of(load_settings);
        CHECK(settings().queues_all);
        CHECK(said == "sdirect: ignoring SDIRECT_QUEUES=some (valid: all, cross), using all\n");
    }
    load_settings();
}

TEST_CASE("a bad value is named in one line with what the setting takes") {
    EnvGuard l("SDIRECT_LOG", "loud");
    EnvGuard e("SDIRECT_CMA", "maybe");
    EnvGuard w("SDIRECT_WINDOW", "lots");
    const std::string said = stderr_of(load_settings);
    CHECK(said.find("sdirect: ignoring SDIRECT_LOG=loud (valid: silent, error, info, debug, 0-3), "
                    "using silent\n") != std::string::npos);
    CHECK(said.find("sdirect: ignoring SDIRECT_CMA=maybe (valid: 1, yes, on, 0, no, off), using 1\n") !=
          std::string::npos);
    CHECK(said.find("sdirect: ignoring SDIRECT_WINDOW=lots (valid: a number from 0 to 4294967295), "
                    "using 2097152\n") != std::string::npos);
    load_settings();
}
