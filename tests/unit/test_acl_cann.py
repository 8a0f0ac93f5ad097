"""runtime.acl where Ascend's samples rely on CANN's behaviour: host memset, memcpy into
bytes_to_ptr buffers, app_log, get_soc_name, data buffers, DVPP memory, get_mem_info after
free, per-thread contexts, and error texts that name addresses, not contents."""
import logging
import threading

import numpy as np
import pytest

import runtime
from runtime import acl
from test_acl import acl_dev  # noqa: F401  (the fixture: acl initialized on device 0)

pytestmark = pytest.mark.timeout(60)


def test_memset_and_memset_async_on_malloc_host_memory(acl_dev):
    host, ret = acl.rt.malloc_host(4096)
    assert ret == 0
    assert acl.rt.memset(host, 4096, 7, 4096) == 0
    assert acl.util.ptr_to_bytes(host, 4096) == b"\x07" * 4096
    stream, _ = acl.rt.create_stream()
    assert acl.rt.memset_async(host + 1024, 3072, 9, 1000, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    data = acl.util.ptr_to_bytes(host, 4096)
    assert data[:1024] == b"\x07" * 1024 and data[1024:2024] == b"\x09" * 1000
    assert data[2024:] == b"\x07" * 2072
    # count beyond max_count, and a value that is not a byte, are still parameter errors
    assert acl.rt.memset(host, 4096, 7, 4097) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memset(host, 4096, 256, 16) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.free_host(host) == 0


def test_memcpy_writes_into_a_bytes_to_ptr_buffer(acl_dev):
    """Ascend's samples read device data back into ``np_data.tobytes()`` through its pointer."""
    size = 1 << 16
    src = np.arange(size, dtype=np.uint8)
    dev, _ = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert acl.rt.memcpy(dev, size, acl.util.numpy_to_ptr(src), size,
                         acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    bytes_data = np.ones(size, dtype=np.byte).tobytes()
    ptr = acl.util.bytes_to_ptr(bytes_data)
    assert acl.rt.memcpy(ptr, size, dev, size, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    assert np.array_equal(np.frombuffer(bytes_data, np.uint8), src)
    # host to host into the middle of it
    assert acl.rt.memcpy(ptr + 10, 5, acl.util.numpy_to_ptr(np.full(5, 200, np.uint8)), 5,
                         acl.ACL_MEMCPY_HOST_TO_HOST) == 0
    assert bytes_data[8:17] == bytes([8, 9, 200, 200, 200, 200, 200, 15, 16])
    # a one-byte bytes object is the interpreter's shared singleton: refused, not corrupted
    one = acl.util.bytes_to_ptr(b"\x05")
    assert acl.rt.memcpy(one, 1, dev, 1, acl.ACL_MEMCPY_DEVICE_TO_HOST) == \
        acl.ACL_ERROR_RT_PARAM_INVALID
    assert b"\x05" == bytes([5])
    assert acl.rt.free(dev) == 0


def test_get_mem_info_counts_freed_memory_as_free(acl_dev):
    free0, total, _ = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    dev, _ = acl.rt.malloc(8 << 20, 0)
    free1, _, _ = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    assert free1 == free0 - (8 << 20)
    assert acl.rt.free(dev) == 0
    free2, total2, ret = acl.rt.get_mem_info(acl.ACL_DDR_MEM)
    assert (free2, total2, ret) == (free0, total, 0)
    assert runtime.memory_reserved() >= 8 << 20      # the pool still caches it


def test_context_is_per_thread_as_in_cann(acl_dev):
    ctx, ret = acl.rt.get_context()
    assert ret == 0 and ctx != 0                     # set_device made the default context
    out = {}

    def other():
        out["before"] = acl.rt.get_context()
        mine, _ = acl.rt.create_context(0)
        out["mine"] = mine
        out["after"] = acl.rt.get_context()
        acl.rt.destroy_context(mine)
        out["destroyed"] = acl.rt.get_context()

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert out["before"] == (0, acl.ACL_ERROR_RT_CONTEXT_NULL) == (0, 107002)
    assert out["after"] == (out["mine"], 0) and out["mine"] != ctx
    assert out["destroyed"] == (0, acl.ACL_ERROR_RT_CONTEXT_NULL)
    assert acl.rt.get_context() == (ctx, 0)          # this thread's context is untouched


def test_data_buffers(acl_dev):
    dev, _ = acl.rt.malloc(1024, 0)
    buf = acl.create_data_buffer(dev, 1024)
    assert isinstance(buf, int) and buf != 0
    assert acl.get_data_buffer_addr(buf) == dev
    assert acl.get_data_buffer_size(buf) == 1024 == acl.get_data_buffer_size_v2(buf)
    assert acl.destroy_data_buffer(buf) == 0
    assert acl.destroy_data_buffer(buf) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.get_data_buffer_addr(buf) == 0 and acl.get_data_buffer_size(buf) == 0
    assert acl.create_data_buffer(dev, -1) == 0
    assert acl.rt.free(dev) == 0                     # destroying the handle kept the memory


def test_dvpp_memory_is_device_memory(acl_dev):
    dev, ret = acl.media.dvpp_malloc(4096)
    assert ret == 0
    src = np.arange(4096, dtype=np.uint8)
    assert acl.rt.memcpy(dev, 4096, acl.util.numpy_to_ptr(src), 4096, 1) == 0
    back = np.zeros(4096, np.uint8)
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(back), 4096, dev, 4096, 2) == 0
    assert np.array_equal(back, src)
    assert acl.media.dvpp_free(dev) == 0
    assert acl.media.dvpp_free(dev) == acl.ACL_ERROR_RT_PARAM_INVALID


def test_numpy_contiguous_to_ptr(acl_dev):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    ptr, same = acl.util.numpy_contiguous_to_ptr(a)
    assert same is a or np.shares_memory(same, a)
    assert ptr == a.__array_interface__["data"][0]
    strided = a[:, ::2]
    ptr2, copy = acl.util.numpy_contiguous_to_ptr(strided)
    assert copy.flags.c_contiguous and np.array_equal(copy, strided)
    assert np.array_equal(acl.util.ptr_to_numpy(ptr2, (4, 3), np.float32), strided)


def test_app_log_and_soc_name(acl_dev):
    assert acl.get_soc_name() == acl.SOC_NAME and acl.get_soc_name().startswith("Ascend")
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("runtime.acl")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        acl.app_log(acl.ACL_WARNING, "camera frame dropped"); line = _this_line() # noqa: E702
        acl.app_log(acl.ACL_DEBUG, "decode done")
        acl.app_log(42, "nope")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    got = [(r.levelno, r.getMessage()) for r in records]
    assert got[0][0] == logging.WARNING and got[0][1].endswith("camera frame dropped")
    assert f"{__file__}:{line}" in got[0][1]
    assert got[1][0] == logging.DEBUG and got[1][1].endswith("decode done")
    assert got[2][0] == logging.ERROR and "aclAppLog failed, ret=100000" in got[2][1] \
        and "log_level=42" in got[2][1]


def _this_line() -> int:
    import sys
    return sys._getframe(1).f_lineno


def test_error_texts_name_addresses_not_contents(acl_dev, caplog):
    host = runtime.malloc_host(1 << 16)
    with pytest.raises(runtime.errors.InvalidParamError) as e:
        runtime.memcpy(runtime.malloc(16), host, 16, runtime.MemcpyKind.DEVICE_TO_DEVICE)
    text = str(e.value)
    assert "\n" not in text and "[0 0 0" not in text and "0, 0, 0" not in text
    with pytest.raises(runtime.errors.InvalidParamError) as e:
        runtime.host_view(np.zeros((300, 300)), 8)
    text = str(e.value)
    assert "numpy.ndarray(shape=(300, 300), dtype=float64)" in text and "\n" not in text
    assert repr(host).startswith("HostBuffer(nbytes=65536, 0x")
