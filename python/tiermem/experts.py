"""Fused experts cut apart, while offloaded (:mod:`tiermem.units` says why and how they are
laid out): the parameters' class that acquires an expert when the forward indexes it (cut by
expert) or a fused tensor when the forward reads it (cut by tensor), and the copy into the
parts."""

from __future__ import annotations

import weakref

import torch

from .units import Experts, view

# Uses of a fused experts tensor that read no data (everything else acquires every expert).
_METADATA_METHODS = {
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.stride, torch.Tensor.numel, torch.Tensor.nelement,
    torch.Tensor.element_size, torch.Tensor.is_contiguous, torch.Tensor.data_ptr, torch.Tensor.storage_offset,
    torch.Tensor.get_device, torch.Tensor.is_floating_point, torch.Tensor.is_complex, torch.Tensor.__len__,
}  # fmt: skip
_METADATA_ATTRIBUTES = {"shape", "dtype", "device", "requires_grad", "ndim", "is_cuda", "is_meta", "layout", "is_leaf",
                        "grad_fn", "itemsize", "nbytes", "is_sparse", "is_quantized", "is_nested", "names", "_version"}


def reads_no_data(func) -> bool:
    """Whether a torch function (or a tensor attribute's getter) looks at a tensor's metadata
    only: its shape, type, device..."""
    return func in _METADATA_METHODS or getattr(getattr(func, "__self__", None), "__name__", None) in _METADATA_ATTRIBUTES


def _torch_function(cls, func, types, args=(), kwargs=None):
    """Dispatch of :class:`ExpertWeights`: the expert(s) or fused tensors a use reads are
    acquired first, while their block runs, and what the use returns that views them is
    remembered (weakly): a unit no live tensor views may be released once the block reads
    another (``Offload._use_experts``). Results are ordinary tensors."""
    kwargs = kwargs or {}
    if reads_no_data(func):
        return _plain(func, args, kwargs)
    reads = []
    for experts, tensor in _active_experts(args):
        offload, site = experts.active
        if experts.by_tensor:
            wanted = [k for k, o in enumerate(experts.tensors) if o.tensor is tensor]
        else:
            e = _expert_index(args[1], experts.count) if func is torch.Tensor.__getitem__ else None
            wanted = range(experts.count) if e is None else (e,)
        offload._use_experts(site, experts, wanted)
        reads.append((experts, tensor, wanted))
    result = _plain(func, args, kwargs)
    for experts, tensor, wanted in reads:
        views = _views_of(tensor, result)
        for k in wanted:
            experts.holding[k] += views
    return result


def _views_of(tensor: torch.Tensor, result) -> list:
    """Weak references to the tensors of ``result`` that share ``tensor``'s memory."""
    storage = _storage(tensor)
    found = []
    for t in result if isinstance(result, (list, tuple)) else (result,):
        if isinstance(t, torch.Tensor) and _storage(t) in (storage, None):
            found.append(weakref.ref(t))
    return found


def _storage(t: torch.Tensor) -> int | None:
    """Where ``t``'s storage starts, or None if it has none to read (taken as a view)."""
    try:
        with torch._C.DisableTorchFunctionSubclass():  # not a use of the experts
            return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _plain(func, args, kwargs):
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


class ExpertWeights(torch.nn.Parameter):
    """The class of a fused experts parameter cut apart (:class:`tiermem.units.Experts`) while
    it is offloaded. While its block runs, any use that reads it acquires what it reads first:
    cut by tensor, the tensor's own buffer; cut by expert, indexing it with one expert acquires
    that expert, and any other use (a grouped GEMM over all experts, a gather of several, a
    print) every expert. Nothing is ever read that is not resident. Outside its block it
    behaves as any offloaded parameter."""

    __torch_function__ = classmethod(_torch_function)


def _active_experts(args) -> list:
    """``(experts, tensor)`` for each marked tensor among ``args`` whose block is running."""
    found = []
    for arg in args:
        for t in arg if isinstance(arg, (list, tuple)) else (arg,):
            experts = getattr(t, "_tiermem_experts", None) if isinstance(t, ExpertWeights) else None
            if experts is not None and experts.active is not None:
                found.append((experts, t))
    return found


def _expert_index(index, count: int) -> int | None:
    """The one expert that ``tensor[index]`` reads, or None (several, or not known)."""
    if isinstance(index, torch.Tensor) and index.dim() == 0 and not index.is_floating_point() and index.dtype != torch.bool:
        index = int(index)  # the experts' loop has synchronized on this index already
    if isinstance(index, int) and not isinstance(index, bool) and -count <= index < count:
        return index % count
    return None


def fill_experts(pool, experts: Experts, stream: int) -> None:
    """Cut by expert: copies slice ``e`` of each fused tensor into part ``e``, then points
    each tensor at its strided view over all the parts. Cut by tensor: copies each tensor into
    its part and points it there. Marks each tensor (:class:`ExpertWeights`)."""
    if experts.by_tensor:
        for owned, unit in zip(experts.tensors, experts.units):
            buffer = unit.parts["weights"]
            with pool.acquired(buffer, stream, write=True):
                view(buffer, 0, owned.tensor).copy_(owned.tensor.detach())
        point_by_tensor(experts)
        return
    for e, unit in enumerate(experts.units):
        buffer = unit.parts["weights"]
        with pool.acquired(buffer, stream, write=True):
            for owned, offset in zip(experts.tensors, experts.offsets):
                src = owned.tensor.detach()[e]
                view(buffer, offset, src).copy_(src)
    parts = [u.parts["weights"] for u in experts.units]
    span, stride = _span(parts), parts[1].ptr - parts[0].ptr
    for owned, offset in zip(experts.tensors, experts.offsets):
        t, size = owned.tensor, owned.tensor.element_size()
        inner = torch.empty(t.shape[1:], device="meta").stride()
        owned.point_at(span.view(t.dtype).as_strided(t.shape, (stride // size, *inner), offset // size))
        _mark(owned, experts)


def point_by_tensor(experts: Experts) -> None:
    """Points each fused tensor cut by tensor at its part, and marks it."""
    for owned, unit in zip(experts.tensors, experts.units):
        owned.point_at(view(unit.parts["weights"], 0, owned.tensor))
        _mark(owned, experts)


def mark_experts(experts: Experts) -> None:
    """Marks each fused tensor again (after :func:`unmark_experts`): its uses acquire it."""
    for owned in experts.tensors:
        _mark(owned, experts)


def _mark(owned, experts: Experts) -> None:
    if owned.role == "param":
        owned.tensor.__class__ = ExpertWeights
        owned.tensor._tiermem_experts = experts


def unmark_experts(param: torch.Tensor) -> None:
    if isinstance(param, ExpertWeights):
        param.__class__ = torch.nn.Parameter
        del param._tiermem_experts


class _Span:
    """Consecutive buffers (``Pool.alloc_parts``) as one range of device memory, described by
    the CUDA Array Interface; a tensor over it keeps every part alive."""

    def __init__(self, parts: list):
        self.parts = parts
        self.size = parts[-1].ptr + parts[-1].size - parts[0].ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.parts[0].ptr, False), "version": 3, "strides": None}


def _span(parts: list) -> torch.Tensor:
    """A uint8 tensor over consecutive buffers, from the first's start to the last's end."""
    return torch.as_tensor(_Span(parts), device="cuda")
