"""An offloaded model's ``state_dict()`` and ``load_state_dict()``, read and written right.

An offloaded model's parameters and buffers point into tiermem buffers, which hold their
bytes only while acquired: elsewhere the bytes may be in host memory, a neighbour's HBM or the
file, and what the device address shows then is stale. ``model.state_dict()`` — what
``torch.save``, transformers' ``save_pretrained`` and checkpointing call — would copy those
addresses raw, and save whatever they show. So every module that owns offloaded tensors gets a
pair of state-dict hooks: the entries of its tensors are read with their buffers acquired and
copied into host memory (the model may be larger than the GPU), and a tensor held under
several names (a tied embedding) is one copy under all of them within one call of the model's
``state_dict``. With ``keep_vars=True`` the caller asks for the tensors themselves, and gets
them, as PyTorch gives them (they are the ones in the model: read them in its forward).

``load_state_dict()`` (resuming from a checkpoint) writes into those tensors: each such
module's ``_load_from_state_dict`` — PyTorch's per-module step of it, the extension point
modules override — runs with the module's buffers acquired for writing, one module at a time,
so the bytes land where the engine keeps them and a model larger than the GPU loads too.
"""

from __future__ import annotations

import torch

from .residency import _stream
from .wrapping import Wrapped


def install(offload) -> list:
    """Hooks ``offload``'s model (a :class:`tiermem.torch.Offload`) so that its
    ``state_dict()`` reads, and its ``load_state_dict()`` writes, each offloaded tensor with its
    buffers acquired; returns the hooks' handles (``.remove()``)."""
    buffers: dict[int, list] = {}  # id(owned) -> the buffers holding it
    owned = []
    for unit in offload.units:
        for o in unit.tensors:
            if "weights" in unit.parts:
                buffers[id(o)] = [unit.parts["weights"]]
                owned.append(o)
    for experts in offload._experts():
        for i, o in enumerate(experts.tensors):
            parts = experts.units[i : i + 1] if experts.by_tensor else experts.units
            buffers[id(o)] = [u.parts["weights"] for u in parts]
            owned.append(o)
    entries: dict[int, tuple[torch.nn.Module, list]] = {}  # id(module) -> (module, [(attr, owned)])
    for o in owned:
        for _, module, attr in o.refs:
            entries.setdefault(id(module), (module, []))[1].append((attr, o))
    call = {"keep_vars": False, "copies": {}}  # of the state_dict call running
    root = offload.model

    def pre(module, prefix, keep_vars):
        call["keep_vars"] = keep_vars
        if module is root:
            call["copies"] = {}

    def post_for(mine: list):
        def post(module, state_dict, prefix, local_metadata):
            if not call["keep_vars"]:
                for attr, o in mine:
                    key = prefix + attr
                    if key in state_dict:
                        state_dict[key] = _copy(offload, o, buffers[id(o)], call["copies"])
            if module is root:
                call["copies"] = {}

        return post

    handles = []
    for module, mine in entries.values():
        handles.append(module.register_state_dict_pre_hook(pre))
        handles.append(module.register_state_dict_post_hook(post_for(mine)))
        load = _acquired_load(offload, [b for _, o in mine for b in buffers[id(o)]])
        handles.append(Wrapped(module, "_load_from_state_dict", load))
    if id(root) not in entries:
        handles.append(root.register_state_dict_pre_hook(pre))
        handles.append(root.register_state_dict_post_hook(post_for([])))
    return handles


def _copy(offload, owned, buffers: list, copies: dict) -> torch.Tensor:
    """``owned``'s tensor copied into host memory with ``buffers`` acquired (once per call)."""
    copy = copies.get(id(owned))
    if copy is None:
        with offload.pool.acquired(buffers, _stream(offload._device), write=False):
            copy = copies[id(owned)] = owned.tensor.detach().to("cpu", copy=True)
    return copy


def _acquired_load(offload, buffers: list):
    """A module's ``_load_from_state_dict`` around PyTorch's, with ``buffers`` acquired for
    writing (:class:`tiermem.wrapping.Wrapped`)."""
    unique = list({id(b): b for b in buffers}.values())

    def around(inner, *args, **kwargs):
        with offload.pool.acquired(unique, _stream(offload._device), write=True):
            return inner(*args, **kwargs)

    return around
