// The unit tests' main: Catch2's. The tests are one file per subject
// (unit_*.cpp), each testing pieces of the library that need no fabric
// and no second process under LD_PRELOAD.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
