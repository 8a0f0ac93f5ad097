"""A pyACL stream / event / memory sample, run on npusim by changing only its import line.

The pattern is the seed article's (an H2D copy stream and a compute stream, an event so the
compute stream waits for the data, a pair of timing events, memory from the pool): its Python
fragment (create_context, two create_stream, memcpy_async on the copy stream) completed with its
aclrtRecordEvent / aclrtStreamWaitEvent / aclrtEventElapsedTime steps, written in pyACL's own
calling convention. Run: ``python examples/acl_streams.py``.
"""
import numpy as np

from runtime import acl        # on a real Ascend host: import acl

ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_CALLBACK_BLOCK = 1


def check(ret, what):
    if ret != 0:
        raise RuntimeError(f"{what} failed, ret={ret}: {acl.get_recent_err_msg()}")


def main():
    device_id = 0
    n = 1 << 20                           # 1 Mi float32 = 4 MiB
    size = n * 4

    check(acl.init(), "acl.init")
    check(acl.rt.set_device(device_id), "acl.rt.set_device")
    context, ret = acl.rt.create_context(device_id)
    check(ret, "acl.rt.create_context")

    # the seed's two streams: one for host-to-device copies, one for compute
    default_stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    h2d_stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")

    # big tensor with HUGE_FIRST, small buffer with NORMAL_ONLY, as the seed advises
    dev_buf, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    dev_out, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    small_buf, ret = acl.rt.malloc(1024 * 4, ACL_MEM_MALLOC_NORMAL_ONLY)
    check(ret, "acl.rt.malloc")
    host_buf, ret = acl.rt.malloc_host(size)
    check(ret, "acl.rt.malloc_host")

    host_np = np.arange(n, dtype=np.float32)
    host_ptr = acl.util.numpy_to_ptr(host_np)
    check(acl.rt.memcpy(host_buf, size, host_ptr, size, 0), "acl.rt.memcpy H2H")

    start, ret = acl.rt.create_event()
    check(ret, "acl.rt.create_event")
    data_ready, ret = acl.rt.create_event()
    check(ret, "acl.rt.create_event")
    stop, ret = acl.rt.create_event()
    check(ret, "acl.rt.create_event")

    # stream1 moves the data and records an event when it is in place
    check(acl.rt.record_event(start, h2d_stream), "acl.rt.record_event")
    check(acl.rt.memcpy_async(dev_buf, size, host_buf, size, ACL_MEMCPY_HOST_TO_DEVICE,
                              h2d_stream), "acl.rt.memcpy_async H2D")
    check(acl.rt.record_event(data_ready, h2d_stream), "acl.rt.record_event")

    # stream2 waits for the event, so its copy reads complete data
    check(acl.rt.stream_wait_event(default_stream, data_ready), "acl.rt.stream_wait_event")
    check(acl.rt.memcpy_async(dev_out, size, dev_buf, size, ACL_MEMCPY_DEVICE_TO_DEVICE,
                              default_stream), "acl.rt.memcpy_async D2D")
    check(acl.rt.memset_async(small_buf, 1024 * 4, 0, 1024 * 4, default_stream),
          "acl.rt.memset_async")
    check(acl.rt.record_event(stop, default_stream), "acl.rt.record_event")
    check(acl.rt.synchronize_stream(default_stream), "acl.rt.synchronize_stream")

    elapsed_ms, ret = acl.rt.event_elapsed_time(start, stop)
    check(ret, "acl.rt.event_elapsed_time")
    status, ret = acl.rt.query_event(stop)
    check(ret, "acl.rt.query_event")

    result = np.zeros(n, dtype=np.float32)
    check(acl.rt.memcpy(acl.util.numpy_to_ptr(result), size, dev_out, size,
                        ACL_MEMCPY_DEVICE_TO_HOST), "acl.rt.memcpy D2H")
    free, total, ret = acl.rt.get_mem_info(1)
    check(ret, "acl.rt.get_mem_info")

    print(f"H2D on stream 1, event, D2D on stream 2: {size >> 20} MiB in {elapsed_ms:.3f} ms")
    print(f"stop event status {status} (0 = ACL_EVENT_STATUS_COMPLETE)")
    print(f"device {device_id}: {free >> 20} MiB free of {total >> 20} MiB")
    print("data round trip", "OK" if np.array_equal(result, host_np) else "MISMATCH")

    for ev in (start, data_ready, stop):
        check(acl.rt.destroy_event(ev), "acl.rt.destroy_event")
    for p in (dev_buf, dev_out, small_buf):
        check(acl.rt.free(p), "acl.rt.free")
    check(acl.rt.free_host(host_buf), "acl.rt.free_host")
    check(acl.rt.destroy_stream(h2d_stream), "acl.rt.destroy_stream")
    check(acl.rt.destroy_stream(default_stream), "acl.rt.destroy_stream")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device(device_id), "acl.rt.reset_device")
    check(acl.finalize(), "acl.finalize")


if __name__ == "__main__":
    main()
