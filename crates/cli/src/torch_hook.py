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

If PyTorch's allocator cannot be replaced (CUDA already initialised, a PyTorch without pluggable
allocators), one line on stderr says so and the program runs on PyTorch's own allocator, over
tiermem's driver route.
"""

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
    """Makes tiermem's pluggable allocator PyTorch's current one."""
    try:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_LIBRARY, "tiermem_torch_malloc", "tiermem_torch_free")
        torch.cuda.memory.change_current_allocator(allocator)
    except Exception as e:  # noqa: BLE001 - any refusal leaves PyTorch's own allocator
        sys.stderr.write(
            f"tiermem: --torch-allocator: PyTorch's allocator could not be replaced ({e}); "
            "the program runs on PyTorch's own allocator over tiermem's driver route\n"
        )


class _Loader(importlib.abc.Loader):
    """The `torch` package's own loader, then [`_install`]."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        # Everything else (resources, source, is_package) is the package's own loader's.
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _install(module)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds `torch` as the other finders do, with [`_Loader`] around its loader; once."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_run_hidden_sitecustomize()
if _LIBRARY:
    if "torch" in sys.modules:
        _install(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterTorch())
