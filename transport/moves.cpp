#include "moves.hpp"

#include <cstdio>
#include <cstdlib>

namespace sd::transport {

void move_refused(const char *what, const char *from, const char *to) noexcept {
    std::fprintf(stderr, "sdirect: %s moved from %s to %s, which its table does not allow\n",
                 what, from, to);
    std::abort();
}

}  // namespace sd::transport
