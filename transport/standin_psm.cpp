// Stand-ins for libpsm2 (Omni-Path) and libpsm_infinipath (TrueScale),
// two libraries that Debian's libfabric links for its psm2 and psm
// providers. Each of them (libpsm_infinipath through libinfinipath)
// times the CPU's cycle counter against gettimeofday in a constructor,
// sleeping in 125 µs steps for about 100 ms, pinned to CPU 0: loading
// libfabric took 200 ms, most of a process's engine build. On a host
// without their hardware neither provider can open an endpoint, so the
// engine loads one of these first, built with the real library's soname:
// the loader then takes it for libfabric's dependency (fabric.cpp says
// when). Every entry point that libfabric may call fails as the real
// library does without a device (21: no device), reports no context, no
// capability and no identifiers, and names its error; libfabric's
// provider then declines, as it would have.
//
// Built twice: SD_STANDIN_PSM2 selects libpsm2's psm2_* interface (symbol
// version PSM2_1.0, standin_psm2.map), otherwise libpsm_infinipath's psm_*.
// The functions ignore their arguments: each is called with the real
// signature, and the calling convention lets a callee ignore what it is
// passed.

namespace {
constexpr long kNoDevice = 21;
const char kWhy[] = "not available on this host (sdirect loaded a stand-in for this library)";
}  // namespace

#define SD_STANDIN_FAIL(name) extern "C" long name() { return kNoDevice; }
#define SD_STANDIN_ZERO(name) extern "C" long name() { return 0; }
#define SD_STANDIN_STRING(name) extern "C" const char *name() { return kWhy; }

#ifdef SD_STANDIN_PSM2
SD_STANDIN_FAIL(psm2_am_get_parameters)
SD_STANDIN_FAIL(psm2_am_get_source)
SD_STANDIN_FAIL(psm2_am_register_handlers)
SD_STANDIN_FAIL(psm2_am_register_handlers_2)
SD_STANDIN_FAIL(psm2_am_reply_short)
SD_STANDIN_FAIL(psm2_am_request_short)
SD_STANDIN_FAIL(psm2_am_unregister_handlers)
SD_STANDIN_ZERO(psm2_capabilities_bitset)
SD_STANDIN_FAIL(psm2_ep_close)
SD_STANDIN_FAIL(psm2_ep_connect)
SD_STANDIN_FAIL(psm2_ep_disconnect)
SD_STANDIN_FAIL(psm2_ep_disconnect2)
SD_STANDIN_FAIL(psm2_ep_epid_lookup)
SD_STANDIN_FAIL(psm2_ep_epid_lookup2)
SD_STANDIN_FAIL(psm2_ep_epid_share_memory)
SD_STANDIN_FAIL(psm2_ep_num_devunits)
SD_STANDIN_FAIL(psm2_ep_open)
SD_STANDIN_FAIL(psm2_ep_open_opts_get_defaults)
SD_STANDIN_FAIL(psm2_ep_query)
SD_STANDIN_ZERO(psm2_epaddr_getctxt)
SD_STANDIN_FAIL(psm2_epaddr_setctxt)
SD_STANDIN_ZERO(psm2_epaddr_setlabel)
SD_STANDIN_FAIL(psm2_epaddr_to_epid)
SD_STANDIN_ZERO(psm2_epid_context)
SD_STANDIN_ZERO(psm2_epid_nid)
SD_STANDIN_ZERO(psm2_epid_port)
SD_STANDIN_FAIL(psm2_error_defer)
SD_STANDIN_STRING(psm2_error_get_string)
SD_STANDIN_FAIL(psm2_error_register_handler)
SD_STANDIN_FAIL(psm2_finalize)
SD_STANDIN_ZERO(psm2_get_capability_mask)
SD_STANDIN_FAIL(psm2_getopt)
SD_STANDIN_FAIL(psm2_info_query)
SD_STANDIN_FAIL(psm2_init)
SD_STANDIN_FAIL(psm2_map_nid_hostname)
SD_STANDIN_FAIL(psm2_mq_cancel)
SD_STANDIN_FAIL(psm2_mq_finalize)
SD_STANDIN_FAIL(psm2_mq_fp_msg)
SD_STANDIN_FAIL(psm2_mq_get_stats)
SD_STANDIN_FAIL(psm2_mq_getopt)
SD_STANDIN_FAIL(psm2_mq_improbe)
SD_STANDIN_FAIL(psm2_mq_improbe2)
SD_STANDIN_FAIL(psm2_mq_imrecv)
SD_STANDIN_FAIL(psm2_mq_init)
SD_STANDIN_FAIL(psm2_mq_ipeek)
SD_STANDIN_FAIL(psm2_mq_ipeek2)
SD_STANDIN_FAIL(psm2_mq_ipeek_dequeue)
SD_STANDIN_FAIL(psm2_mq_ipeek_dequeue_multi)
SD_STANDIN_FAIL(psm2_mq_iprobe)
SD_STANDIN_FAIL(psm2_mq_iprobe2)
SD_STANDIN_FAIL(psm2_mq_irecv)
SD_STANDIN_FAIL(psm2_mq_irecv2)
SD_STANDIN_FAIL(psm2_mq_isend)
SD_STANDIN_FAIL(psm2_mq_isend2)
SD_STANDIN_FAIL(psm2_mq_req_free)
SD_STANDIN_FAIL(psm2_mq_send)
SD_STANDIN_FAIL(psm2_mq_send2)
SD_STANDIN_FAIL(psm2_mq_setopt)
SD_STANDIN_FAIL(psm2_mq_test)
SD_STANDIN_FAIL(psm2_mq_test2)
SD_STANDIN_FAIL(psm2_mq_wait)
SD_STANDIN_FAIL(psm2_mq_wait2)
SD_STANDIN_FAIL(psm2_poll)
SD_STANDIN_FAIL(psm2_setopt)
SD_STANDIN_ZERO(psm2_uuid_generate)
#else
SD_STANDIN_FAIL(psm_am_get_parameters)
SD_STANDIN_FAIL(psm_am_register_handlers)
SD_STANDIN_FAIL(psm_am_reply_short)
SD_STANDIN_FAIL(psm_am_request_short)
SD_STANDIN_FAIL(psm_ep_close)
SD_STANDIN_FAIL(psm_ep_connect)
SD_STANDIN_FAIL(psm_ep_epid_lookup)
SD_STANDIN_FAIL(psm_ep_epid_share_memory)
SD_STANDIN_FAIL(psm_ep_num_devunits)
SD_STANDIN_FAIL(psm_ep_open)
SD_STANDIN_FAIL(psm_ep_open_opts_get_defaults)
SD_STANDIN_FAIL(psm_ep_query)
SD_STANDIN_ZERO(psm_epaddr_getctxt)
SD_STANDIN_FAIL(psm_epaddr_setctxt)
SD_STANDIN_ZERO(psm_epaddr_setlabel)
SD_STANDIN_ZERO(psm_epid_context)
SD_STANDIN_ZERO(psm_epid_nid)
SD_STANDIN_ZERO(psm_epid_port)
SD_STANDIN_FAIL(psm_error_defer)
SD_STANDIN_STRING(psm_error_get_string)
SD_STANDIN_FAIL(psm_error_register_handler)
SD_STANDIN_FAIL(psm_finalize)
SD_STANDIN_FAIL(psm_getopt)
SD_STANDIN_FAIL(psm_init)
SD_STANDIN_FAIL(psm_map_nid_hostname)
SD_STANDIN_FAIL(psm_mq_cancel)
SD_STANDIN_FAIL(psm_mq_finalize)
SD_STANDIN_FAIL(psm_mq_get_stats)
SD_STANDIN_FAIL(psm_mq_getopt)
SD_STANDIN_FAIL(psm_mq_init)
SD_STANDIN_FAIL(psm_mq_ipeek)
SD_STANDIN_FAIL(psm_mq_iprobe)
SD_STANDIN_FAIL(psm_mq_irecv)
SD_STANDIN_FAIL(psm_mq_isend)
SD_STANDIN_FAIL(psm_mq_send)
SD_STANDIN_FAIL(psm_mq_setopt)
SD_STANDIN_FAIL(psm_mq_test)
SD_STANDIN_FAIL(psm_mq_wait)
SD_STANDIN_FAIL(psm_poll)
SD_STANDIN_FAIL(psm_setopt)
SD_STANDIN_ZERO(psm_uuid_generate)
#endif
