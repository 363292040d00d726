"""What the probes that call the driver through ctypes share (map_stall.py, migrate_cost.py,
vmm_parallel.py, pin_speed.py, pin_split.py, pin_span.py, pinned_copy_speed.py): libcuda, the
driver's structures for cuMemCreate and cuMemSetAccess, and GPU 0's primary context made
current (`start`)."""
import ctypes as C

cuda = C.CDLL("libcuda.so.1")


def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: CUresult {r}")


class Location(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class AllocFlags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Location), ("win32", C.c_void_p), ("flags", AllocFlags)]


class Access(C.Structure):
    _fields_ = [("location", Location), ("flags", C.c_int)]


def start():
    """cuInit, GPU 0's primary context made current: (device, context)."""
    ok(cuda.cuInit(0), "cuInit")
    dev, ctx = C.c_int(), C.c_void_p()
    ok(cuda.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
    ok(cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain")
    ok(cuda.cuCtxSetCurrent(ctx), "set current")
    return dev, ctx
