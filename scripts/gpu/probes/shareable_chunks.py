"""Can every chunk of `tiermem run` be shareable as a POSIX fd, and what does it cost?

For legacy CUDA IPC on tiermem memory (`cuIpcGetMemHandle` → the chunks' fds), chunks must be
created with `requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`. This times
cuMemCreate of 32 MiB chunks in HBM and on the host NUMA node, plain and shareable, and exports
one of each (`cuMemExportToShareableHandle`). Then: does creating host chunks from several
threads at once go faster (a budget cut sends hundreds of chunks down, each needing a host
chunk)? One JSON line on stdout.
"""
import ctypes as C
import json
import statistics
import sys
import threading
import time

from vmm import Prop, Location, cuda, ok, start

DEVICE, HOST_NUMA = 1, 3  # CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST_NUMA
POSIX_FD = 1
CHUNK = 32 << 20
COUNT = 40


def create_times(location, handle_types):
    prop = Prop()
    prop.type = 1  # pinned
    prop.requestedHandleTypes = handle_types
    prop.location = location
    times, handles = [], []
    for _ in range(COUNT):
        h = C.c_ulonglong()
        t = time.perf_counter()
        r = cuda.cuMemCreate(C.byref(h), C.c_size_t(CHUNK), C.byref(prop), C.c_ulonglong(0))
        times.append(time.perf_counter() - t)
        if r != 0:
            return {"error": f"cuMemCreate: CUresult {r}"}, []
        handles.append(h)
    return {"median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3}, handles


def main():
    dev, ctx = start()
    numa = C.c_int()
    ok(cuda.cuDeviceGetAttribute(C.byref(numa), 134, dev), "HOST_NUMA_ID")  # CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID
    out = {}
    for name, location in [("hbm", Location(DEVICE, dev.value)), ("host", Location(HOST_NUMA, max(numa.value, 0)))]:
        for kind, types in [("plain", 0), ("shareable", POSIX_FD)]:
            result, handles = create_times(location, types)
            if handles and kind == "shareable":
                fd = C.c_int(-1)
                r = cuda.cuMemExportToShareableHandle(C.byref(fd), handles[0], POSIX_FD, C.c_ulonglong(0))
                result["export"] = "ok" if r == 0 and fd.value >= 0 else f"CUresult {r}"
                if r == 0:
                    h = C.c_ulonglong()
                    r = cuda.cuMemImportFromShareableHandle(C.byref(h), C.c_void_p(fd.value), POSIX_FD)
                    result["import"] = "ok" if r == 0 else f"CUresult {r}"
                    if r == 0:
                        cuda.cuMemRelease(h)
            for h in handles:
                ok(cuda.cuMemRelease(h), "cuMemRelease")
            out[f"{name}_{kind}"] = result
    host = Location(HOST_NUMA, max(numa.value, 0))
    for threads in (1, 2, 4, 8):
        made, errors = [], []

        def work():
            cuda.cuCtxSetCurrent(ctx)
            result, handles = create_times(host, POSIX_FD)
            (errors.append(result) if "error" in result else made.extend(handles))

        started = time.perf_counter()
        pool = [threading.Thread(target=work) for _ in range(threads)]
        [t.start() for t in pool]
        [t.join() for t in pool]
        seconds = time.perf_counter() - started
        for h in made:
            ok(cuda.cuMemRelease(h), "cuMemRelease")
        out[f"host_shareable_{threads}_threads"] = {
            "chunks": len(made), "seconds": seconds, "gb_per_s": len(made) * CHUNK / seconds / 1e9, "errors": errors[:1]}
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
