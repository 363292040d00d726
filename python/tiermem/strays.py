"""Tensors a module uses that another module owns: a parent calling
``F.linear(x, self.proj.weight)`` without calling ``self.proj``, say.

:mod:`tiermem.torch` acquires a module's own tensors (and the tied ones it shares) while the
module runs, so such a use would read memory that is not acquired: wrong bytes, or on the GPU
an illegal address. While a model's first pass is recorded, :class:`Strays` sees every torch
function call of the forward pass; a tensor of the model whose buffer no running module holds
is acquired at once, held with the innermost running module, and from then on belongs to that
module's site (:meth:`tiermem.torch.Offload._adopt`): acquired whenever the site runs, forward
and backward, and in the recorded schedule. A use in the model's own forward, outside every
module that has a site, makes the model one (it then holds what it adopts for its whole
forward, and in backward until its gradients are done). Later passes are not watched (a Python call per
operation would slow every pass), so a use that first appears after the first pass is not
caught."""

from __future__ import annotations

from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from .experts import reads_no_data


class Strays(TorchFunctionMode):
    """The watch over one recording pass of ``offload`` (an :class:`tiermem.torch.Offload`)."""

    def __init__(self, offload):
        super().__init__()
        self.offload = offload

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if reads_no_data(func):  # a tensor's dtype or shape: no data read
            return func(*args, **kwargs)
        owner, running = self.offload._owner, self.offload._running
        for t in tree_leaves((args, kwargs)):
            found = owner.get(id(t))
            if found is not None and found[1].tensor is t:
                unit, owned = found
                if not any(b is unit.parts["weights"] for s in running for held in s.held for b in held):
                    self.offload._adopt(unit, owned)
        return func(*args, **kwargs)
