// Settings: every one declared with its help text, parsed from the
// environment, and bad values falling back to the defaults.
#include <catch2/catch.hpp>

#include "unit_env.hpp"

#include "transport/settings.hpp"

#include <cstring>
#include <string>
#include <unistd.h>

using namespace sd::transport;

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
