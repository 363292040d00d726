"""A module's method wrapped on the instance, and the handle that unwraps it: how
:mod:`tiermem.torch` hooks each module's ``forward`` (cheaper than PyTorch's module hooks) and
:mod:`tiermem.state` each module's ``_load_from_state_dict``."""

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
