"""A module's method wrapped on the instance, and the handle that unwraps it: how
:mod:`tiermem.torch` hooks each module's ``forward`` (cheaper than PyTorch's module hooks,
:func:`hooked`) and :mod:`tiermem.state` each module's ``_load_from_state_dict``."""

from __future__ import annotations

import functools

import torch


class Wrapped:
    """``module.<name>`` replaced, on the instance, by a wrapper that calls
    ``around(inner, *args, **kwargs)``, ``inner`` being the method it replaced; the wrapper
    keeps the method's name, doc and signature (``functools.wraps``). :meth:`remove` puts the
    method back — or, if something wrapped it since, leaves ours in place calling straight
    through — and lets go of ``around`` (and what it holds)."""

    def __init__(self, module: torch.nn.Module, name: str, around):
        self.module, self.name, self.around = module, name, around
        self.own = module.__dict__.get(name)  # an instance attribute set before ours, if any
        inner = getattr(module, name)

        @functools.wraps(inner)
        def wrapper(*args, **kwargs):
            around = self.around
            if around is None:
                return inner(*args, **kwargs)
            return around(inner, *args, **kwargs)

        self.wrapper = wrapper
        setattr(module, name, wrapper)

    def remove(self) -> None:
        self.around = None
        if self.module.__dict__.get(self.name) is self.wrapper:
            if self.own is None:
                delattr(self.module, self.name)
            else:
                setattr(self.module, self.name, self.own)


def hooked(module: torch.nn.Module, before, after):
    """A site's forward around the module's own: ``before(module, args)``, then
    ``after(module, args, output)`` — as PyTorch's module hooks are called, but on a forward
    wrapped in place (:class:`Wrapped`): a module with hooks takes PyTorch's
    slow call path, 5 µs a module on the H200 host (``scripts/gpu/probes/hook_time.py``), a
    wrapped one the fast path. A forward that raises releases what ``before`` acquired
    (``after`` with no output) and raises on."""

    def around(inner, *args, **kwargs):
        before(module, args)
        try:
            output = inner(*args, **kwargs)
        except BaseException:
            after(module, args, None)
            raise
        after(module, args, output)
        return output

    return around
