// An environment variable set for the scope of a test (settings are read
// from the environment by load_settings()).
#pragma once
#include <cstdlib>

struct EnvGuard {
    const char *name;
    explicit EnvGuard(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
    ~EnvGuard() { unsetenv(name); }
};
