"""A disk's read speed measured honestly, for bench/torch_bench.py's loading: the files'
pages dropped from the page cache first (no root needed), the fraction still cached reported
beside the speed, and the files read as a plain program reads them."""

from __future__ import annotations

import ctypes
import mmap
import os
import time

MiB = 1 << 20


def drop_page_cache(paths) -> None:
    """Asks the kernel to drop the files' pages (written back first): no root needed."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_fraction(paths) -> float:
    """The fraction of the files' pages in the page cache (mincore), to report honestly
    whether the disk or the cache was measured."""
    libc = ctypes.CDLL(None, use_errno=True)
    page, resident, total = os.sysconf("SC_PAGE_SIZE"), 0, 0
    for path in paths:
        size = os.path.getsize(path)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            pages = -(-size // page)
            vec = (ctypes.c_ubyte * pages)()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                return float("nan")
            resident += sum(v & 1 for v in vec)
            total += pages
    return resident / max(total, 1)


def disk_read_GBps(paths, block=16 * MiB) -> float:
    """Sequential buffered reads of the files, as a plain program reads them."""
    buf = memoryview(bytearray(block))
    total, t0 = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total / (time.perf_counter() - t0) / 1e9
