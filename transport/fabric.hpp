// libfabric, loaded lazily with dlopen so that a program which never opens
// a TCP connection is untouched by it (Debian's libfabric pulls in
// libraries whose constructors install signal handlers). Only a handful of
// entry points are real symbols; the rest are inline wrappers over the ops
// tables of the objects those return.
#pragma once
#include <cstddef>
#include <cstdint>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>

namespace sd::transport {

// One RDM endpoint with its CQ and AV: the process's single fabric port.
struct Endpoint {
    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_av *av = nullptr;
    fid_cq *cq = nullptr;
    fid_ep *ep = nullptr;
    char name[96] = {};       // fi_getname(), an "fi_shm://..." string on shm
    std::size_t name_len = 0;
    std::size_t inject_size = 0;
    bool can_read = false;   // FI_READ | FI_REMOTE_READ granted
    int rma_iov_limit = 1;   // local iovecs per RMA operation
};

// Sets the variables the provider libraries read as they load (where the
// application left them unset). Called from the library's constructor,
// before any thread exists: setenv() rewrites `environ`, which the
// application's own threads read without the libc's lock (getenv, a
// spawn's environment), so it must not run on the builder thread.
void fabric_pin_environment() noexcept;

// dlopen + dlsym once; false if libfabric is not installed.
bool fabric_available() noexcept;

// Opens an endpoint of `provider`; `unique` makes the shm region name
// distinct from any earlier process with the same pid. 0 or -errno.
int endpoint_open(Endpoint &e, const char *provider, const char *unique) noexcept;

// Closes what endpoint_open created (only in the process that opened it).
void endpoint_close(Endpoint &e) noexcept;

const char *fabric_strerror(int err) noexcept;

// The process is exiting (its exit hook): an endpoint_open() under way
// stops before its next call into libfabric and parks its thread for good,
// so that the exit waits for no more than the step in progress (a dlopen,
// or one fi_getinfo). Parked threads hold no lock of ours or libfabric's.
void fabric_exit_began() noexcept;
// True once exit began, and once a builder has parked.
bool fabric_exiting() noexcept;
bool fabric_builder_parked() noexcept;

// The loaded library's FI_VERSION(major, minor); 0 if none.
std::uint32_t fabric_version() noexcept;

}  // namespace sd::transport
