"""Activations saved for backward kept in tiermem buffers (:func:`offload_activations`), so
that they can leave HBM between forward and backward. Part of :mod:`tiermem.torch`, which
re-exports it.

**The same buffers every step.** A training step saves the same tensors, in the same order,
every step. So each saved tensor is numbered by its place in the pass (a pass begins with the
first tensor saved after backward has taken one back), and the buffer that held the tensor
saved at that place last step holds it again: once backward has taken a tensor back and
autograd has let it go, its buffer's bytes are discarded (``Pool.discard``: nothing is copied
down, nothing is paged in when it is written again) and the buffer waits for the next pass.
Each buffer is noted as used by the step that saved it and the step that takes it back
(``Pool.step_also_uses``), so an offloaded model's recorded schedule (:func:`tiermem.torch.offload`)
holds its activations like its weights: they are evicted by next use and paged in ahead of
backward, instead of waiting on demand. A buffer left unused for a whole pass (a shorter
sequence, a different model) is freed."""

from __future__ import annotations

import weakref

import torch

from ._tiermem import InvalidArgumentError, Pool
from .torch import _REGISTERED, _require_gpu, _size, _stream
from .units import view as _view

_STORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Pool -> its _Store


class _Saved:
    """A tensor saved for backward, in ``buffer``; when autograd lets it go, the buffer goes
    back to its store (or is freed with this, if the store is gone)."""

    __slots__ = ("buffer", "shape", "dtype", "place", "store", "__weakref__")

    def __init__(self, store: _Store, buffer, shape, dtype, place: int):
        self.buffer, self.shape, self.dtype, self.place = buffer, shape, dtype, place
        self.store = weakref.ref(store)

    def __del__(self):
        store = self.store()
        if store is not None:
            store.returned(self.place, self.buffer)


class _Store:
    """The activation buffers of one Pool: those in use, and those waiting for their place in
    the next pass."""

    def __init__(self, pool: Pool):
        self.pool = weakref.ref(pool)
        self.spare: dict[int, tuple[object, int]] = {}  # place -> (buffer, pass it came back in)
        self.passes, self.place, self.taken_back = 0, 0, False
        self.saved: list = []  # weak references to this pass's saved tensors, in order

    def save(self, pool: Pool, t: torch.Tensor, nbytes: int) -> _Saved:
        if self.taken_back:  # the first tensor saved after a backward: a new pass
            self.passes, self.place, self.taken_back, self.saved = self.passes + 1, 0, False, []
            for place in [p for p, (_, came) in self.spare.items() if came < self.passes - 1]:
                del self.spare[place]  # unused for a whole pass: freed with its Buffer
        place, self.place = self.place, self.place + 1
        buffer, _ = self.spare.pop(place, (None, 0))
        if buffer is None or buffer.size != nbytes:
            buffer = pool.alloc(nbytes, name="activation")
        src = t.detach().contiguous()
        with pool.acquired(buffer, _stream(), write=True):
            _view(buffer, 0, src).copy_(src)
        pool.step_also_uses([buffer])
        saved = _Saved(self, buffer, src.shape, src.dtype, place)
        self.saved.append(weakref.ref(saved))
        return saved

    def take_back(self, pool: Pool, saved: _Saved, prefetch: int) -> torch.Tensor:
        self.taken_back = True
        place = saved.place  # its index in self.saved, if saved in this pass
        if prefetch > 0 and place < len(self.saved) and self.saved[place]() is saved:
            earlier = [s.buffer for s in (r() for r in self.saved[max(0, place - prefetch) : place]) if s is not None]
            if earlier:
                pool.prefetch(earlier)  # into free HBM only; the schedule pages ahead otherwise
        pool.step_also_uses([saved.buffer])
        out = torch.empty(saved.shape, dtype=saved.dtype, device="cuda")
        with pool.acquired(saved.buffer, _stream()):
            out.copy_(_view(saved.buffer, 0, out))
        return out

    def returned(self, place: int, buffer) -> None:
        """Autograd let go of the tensor saved at ``place``: its bytes are dead."""
        pool = self.pool()
        if pool is None or pool.closed:
            return
        try:
            pool.discard([buffer])
        except Exception:  # noqa: BLE001  (called from __del__: the buffer is freed instead)
            return
        self.spare[place] = (buffer, self.passes)


class offload_activations:  # noqa: N801  (a function to its callers, as it always was)
    """``with offload_activations(pool):`` — within it, tensors that autograd saves for
    backward (at least ``min_bytes``: bytes, or a string such as ``"1MiB"``) are copied into tiermem buffers, so they can leave HBM
    until backward needs them. Offloaded parameters are left alone (they are tiermem buffers
    already). When backward takes one back, the ``prefetch`` saved just before it start
    paging in (into free HBM only).

    Each Pool keeps its activation buffers from step to step (this module's docstring): the
    tensor saved at the same place in the next step reuses the buffer, its dead bytes
    discarded rather than copied, and a model offloaded into the same Pool has them in its
    schedule. Enter it every step, or once around the whole loop.

    Use it only where the activations do not fit beside the pool's cap: they cross the link
    twice a step (on the H200 a 0.85 B Llama under an 8 GiB cap trained in 0.65–0.70 s a step
    with its 9.7 GB of activations here, 0.41 s with them left to PyTorch)."""

    def __init__(self, pool: Pool, min_bytes: int | str = 1 << 20, prefetch: int = 2):
        min_bytes = _size("offload_activations", "min_bytes", min_bytes)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise InvalidArgumentError(f"offload_activations: prefetch is {prefetch!r}: give a count of saved tensors, 0 or more")
        _require_gpu(pool, "offload_activations")
        self.pool, self.min_bytes, self.prefetch = pool, min_bytes, prefetch
        self.store = _STORES.get(pool)
        if self.store is None:
            self.store = _STORES[pool] = _Store(pool)
        self._hooks: list = []

    def _pack(self, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        if not t.is_cuda or nbytes < self.min_bytes or t.untyped_storage().data_ptr() in _REGISTERED:
            return t
        return self.store.save(self.pool, t, nbytes)

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        return self.store.take_back(self.pool, packed, self.prefetch)

    def __enter__(self) -> offload_activations:
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks.append(hooks)
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.pop().__exit__(*exc)
