"""Stream-ordered memory pools under `tiermem run` (issue 16, docs/transparent.md "Memory pools").

1. CuPy's `MemoryAsyncPool` (cudaMallocFromPoolAsync on the GPU's current pool, the default
   one) allocates 1.5 GiB in 256 MiB arrays: under a 1 GiB budget the arrays beyond it live on
   the host (tiermem's memory, `--stats`), every array's bytes are checked; freed and allocated
   again, the same sizes come back.
2. A pool the program creates (cuda.bindings: cuMemPoolCreate on GPU 0) keeps its own
   allocations: 256 MiB from it are the driver's, not counted against the budget
   (cuMemGetInfo's free memory does not change), written and read back.

Run plainly and under `tiermem run --hbm-limit 1GiB --stats`; one JSON line on stdout.
"""
import json
import sys

import cupy
from cuda.bindings import driver as cu

MIB = 1 << 20


def check(result):
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def default_pool_arrays(out):
    pool = cupy.cuda.MemoryAsyncPool()
    cupy.cuda.set_allocator(pool.malloc)
    n = 256 * MIB // 4
    arrays = [cupy.full(n, i + 1, dtype=cupy.int32) for i in range(6)]
    out["default_pool_sums_ok"] = all(int(a.sum()) == n * (i + 1) for i, a in enumerate(arrays))
    first = [a.data.ptr for a in arrays]
    del arrays
    cupy.cuda.Stream.null.synchronize()
    arrays = [cupy.full(n, 7 * (i + 1), dtype=cupy.int32) for i in range(6)]
    out["default_pool_again_ok"] = all(int(a.sum()) == 7 * n * (i + 1) for i, a in enumerate(arrays))
    out["default_pool_same_addresses"] = sorted(first) == sorted(a.data.ptr for a in arrays)
    free, total = cupy.cuda.runtime.memGetInfo()
    out["mem_get_info_total_gib"] = round(total / 2**30, 3)
    del arrays
    cupy.cuda.Stream.null.synchronize()
    cupy.cuda.set_allocator(None)


def own_pool(out):
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = check(cu.cuMemPoolCreate(props))
    free_before, _ = check(cu.cuMemGetInfo())
    stream = cu.CUstream(0)
    ptr = check(cu.cuMemAllocFromPoolAsync(256 * MIB, pool, stream))
    check(cu.cuMemsetD32Async(ptr, 0x5EED, 64 * MIB, stream))
    check(cu.cuStreamSynchronize(stream))
    free_after, _ = check(cu.cuMemGetInfo())
    view = cupy.ndarray((64 * MIB,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(int(ptr), 256 * MIB, None), 0))
    out["own_pool_bytes_ok"] = bool((view == 0x5EED).all())
    out["own_pool_uncounted"] = free_after == free_before
    check(cu.cuMemFreeAsync(ptr, stream))
    check(cu.cuStreamSynchronize(stream))
    check(cu.cuMemPoolDestroy(pool))


def main():
    out = {}
    for step in (default_pool_arrays, own_pool):
        try:
            step(out)
        except Exception as e:  # noqa: BLE001 - recorded: the point is to see what fails
            out[step.__name__] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    print(json.dumps(out))
    # `own_pool_uncounted` is false when run plainly: the driver counts the pool's memory.
    ok = ["default_pool_sums_ok", "default_pool_again_ok", "own_pool_bytes_ok"]
    return 0 if all(out.get(k) is True for k in ok) else 1


if __name__ == "__main__":
    sys.exit(main())
