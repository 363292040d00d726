"""tiermem's hook for `tiermem run --torch-allocator` (docs/transparent.md, "The PyTorch route").

`tiermem run` writes this file as `sitecustomize.py` into a folder of its own and puts that folder
first on PYTHONPATH, so every Python process of the command (and its children) runs it at start.
It does two things:

* runs the `sitecustomize` it hides, if the interpreter has one further down the path (a
  distribution's, a virtual environment's), so nothing the program relied on is lost;
* once `torch` has been imported (never before: a program that does not use PyTorch pays
  nothing), makes tiermem's `CUDAPluggableAllocator` PyTorch's allocator, before the first CUDA
  allocation: the library named by TIERMEM_TORCH_ALLOCATOR (tiermem's preload library) serves
  `tiermem_torch_malloc` / `tiermem_torch_free`.

`torch.compile(mode="reduce-overhead")`'s CUDA graph trees need the caching allocator's
checkpoints of its graph pool (`checkPoolLiveAllocations`, `setCheckpointPoolState`), which
PyTorch refuses for a pluggable allocator ("pluggable does not yet support …"): once the
allocator is installed, Inductor's configuration, when it is imported, gets
`triton.cudagraph_trees = False`, so that the mode replays Inductor's plain CUDA graphs (one
private pool per graph, which the pluggable allocator serves) with the same kernels.

A pluggable allocator has no memory statistics in PyTorch (`torch.cuda.memory_stats()`,
`max_memory_allocated()`, `reset_peak_memory_stats()` raise): once it is installed, the hook
answers them from tiermem's counters of the tensors it serves (torch_stats.rs), in the shape
PyTorch's caching allocator gives them; and `torch.cuda.empty_cache()` gives back the memory
tiermem keeps for freed tensors (torch_alloc.rs).

If PyTorch's allocator cannot be replaced (CUDA already initialised, a PyTorch without pluggable
allocators), one line on stderr says so and the program runs on PyTorch's own allocator, over
tiermem's driver route.
"""

import ctypes
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBRARY = os.environ.get("TIERMEM_TORCH_ALLOCATOR", "")


def _run_hidden_sitecustomize():
    """Runs the `sitecustomize` this file hides, if there is one."""
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - as the interpreter does: say it and go on
        sys.stderr.write(f"tiermem: the program's sitecustomize ({spec.origin}) failed: {e!r}\n")


def _install(torch):
    """Makes tiermem's pluggable allocator PyTorch's current one, and its statistics PyTorch's."""
    try:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_LIBRARY, "tiermem_torch_malloc", "tiermem_torch_free")
        torch.cuda.memory.change_current_allocator(allocator)
    except Exception as e:  # noqa: BLE001 - any refusal leaves PyTorch's own allocator
        sys.stderr.write(
            f"tiermem: --torch-allocator: PyTorch's allocator could not be replaced ({e}); "
            "the program runs on PyTorch's own allocator over tiermem's driver route\n"
        )
        return
    try:
        _answer_memory_stats(torch, ctypes.CDLL(_LIBRARY))
    except (OSError, AttributeError) as e:
        sys.stderr.write(f"tiermem: --torch-allocator: no memory statistics ({e}); torch.cuda.memory_stats() raises\n")
    _after_import("torch._inductor.config", _plain_cuda_graphs)


def _plain_cuda_graphs(config):
    """Inductor's plain CUDA graphs instead of graph trees, which a pluggable allocator cannot
    serve (module documentation)."""
    config.triton.cudagraph_trees = False


# What tiermem_torch_memory_stats writes, in order (torch_stats.rs).
_FIELDS = ("allocated", "allocated_peak", "allocated_total", "freed_total", "allocations", "frees",
           "reserved", "reserved_peak", "kept_for_graphs")


def _answer_memory_stats(torch, library):
    """Answers PyTorch's memory statistics (`torch._C._cuda_memoryStats` and the resets, which
    torch.cuda.memory calls at each use) from tiermem's counters."""
    read = library.tiermem_torch_memory_stats
    read.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
    read.restype = ctypes.c_int
    for name in ("tiermem_torch_reset_peak", "tiermem_torch_reset_accumulated", "tiermem_torch_empty_cache"):
        getattr(library, name).argtypes = () if name.endswith("empty_cache") else (ctypes.c_int,)
        getattr(library, name).restype = ctypes.c_int

    def counters(device):
        values = (ctypes.c_uint64 * len(_FIELDS))()
        if read(int(device), values, len(_FIELDS)) != len(_FIELDS):
            raise RuntimeError(f"tiermem: memory statistics of GPU {device}: no such GPU")
        return dict(zip(_FIELDS, values))

    def memory_stats(device):
        c = counters(device)
        none = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
        # Every tensor is an allocation of its own: PyTorch's "large pool", blocks and segments alike.
        pools = lambda stat: {"all": stat, "large_pool": stat, "small_pool": none}  # noqa: E731
        live = {"current": c["allocated"], "peak": c["allocated_peak"], "allocated": c["allocated_total"],
                "freed": c["freed_total"]}
        held = {"current": c["reserved"], "peak": c["reserved_peak"], "allocated": c["allocated_total"],
                "freed": c["freed_total"] - c["kept_for_graphs"]}
        count = {"current": c["allocations"] - c["frees"], "peak": c["allocations"] - c["frees"],
                 "allocated": c["allocations"], "freed": c["frees"]}
        return {
            "allocated_bytes": pools(live), "active_bytes": pools(live), "requested_bytes": pools(live),
            "reserved_bytes": pools(held), "inactive_split_bytes": pools(none),
            "allocation": pools(count), "active": pools(count), "segment": pools(count),
            "inactive_split": pools(none), "oversize_allocations": none, "oversize_segments": none,
            "num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
            "num_device_alloc": c["allocations"], "num_device_free": c["frees"], "max_split_size": -1,
        }

    torch._C._cuda_memoryStats = memory_stats
    torch._C._cuda_resetPeakMemoryStats = lambda device: library.tiermem_torch_reset_peak(int(device))
    torch._C._cuda_resetAccumulatedMemoryStats = lambda device: library.tiermem_torch_reset_accumulated(int(device))
    def empty_cache():
        # torch.cuda.empty_cache(): the freed tensors' memory tiermem keeps goes back to the driver.
        library.tiermem_torch_empty_cache()

    torch._C._cuda_emptyCache = empty_cache


class _Loader(importlib.abc.Loader):
    """A module's own loader, then `then(module)`."""

    def __init__(self, inner, then):
        self._inner, self._then = inner, then

    def __getattr__(self, name):
        # Everything else (resources, source, is_package) is the package's own loader's.
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            self._then(module)
        except Exception as e:  # noqa: BLE001 - tiermem's hook must never break the import
            sys.stderr.write(f"tiermem: --torch-allocator: after importing {module.__name__}: {e!r}; left as it was\n")


class _After(importlib.abc.MetaPathFinder):
    """Finds module `name` as the other finders do, with [`_Loader`] around its loader; once."""

    def __init__(self, name, then):
        self._name, self._then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self._then)
        return spec


def _after_import(name, then):
    """Runs `then(module)` once module `name` is imported: now if it is already."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _After(name, then))


_run_hidden_sitecustomize()
if _LIBRARY:
    _after_import("torch", _install)
