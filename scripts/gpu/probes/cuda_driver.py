"""The CUDA driver for the probes that call it through ctypes: libcuda, a check of each
CUresult, and GPU 0's primary context made current."""
import ctypes

cuda = ctypes.CDLL("libcuda.so.1")


def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: CUresult {r}")


def primary_context():
    """cuInit, then GPU 0's primary context retained and made current: (device, context)."""
    ok(cuda.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cuda.cuCtxSetCurrent(ctx), "set current")
    return dev, ctx
