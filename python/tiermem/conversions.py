"""Checkpoints saved under other names than the model's: transformers' own conversions, read
byte for byte.

Since transformers 5 a model's tensors need not be named or shaped as its checkpoint's: a
Mixtral's experts are one fused tensor per projection (``mlp.experts.gate_up_proj``:
``[experts, 2 * mlp, hidden]``), while every Mixtral checkpoint, and ``save_pretrained`` itself,
stores them one expert and one projection at a time (``block_sparse_moe.experts.3.w1.weight``).
transformers converts on load with the rules it registers per model type
(``transformers.conversion_mapping``): renamings, and converters that merge a list of
experts (``MergeModulelist(dim=0)``) and concatenate projections (``Concatenate(dim=1)``).

:func:`converted` applies those same rules to the checkpoint's names, with transformers' own
functions, and describes each converted tensor as its sources laid end to end: for a merge and
a concatenation, expert ``e``'s rows of projection ``k`` are one contiguous run of the fused
tensor, so each source is read straight into its place, as any tensor is
(:mod:`tiermem.loading`). Conversions of another kind (splits, transposes, permutations) are
not done: a tensor that needs one is named in the error, which says to load the model with
transformers and offload it. Without transformers' conversion API, names are taken as they are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch


@dataclass
class Assembled:
    """A model tensor made of checkpoint tensors (``Entry``s): ``parts`` are ``(element
    offset, entry)``, in order, covering ``shape`` exactly."""

    name: str
    shape: tuple[int, ...]
    parts: list = field(default_factory=list)

    @property
    def sources(self) -> list[str]:
        return [e.name for _, e in self.parts]


def converted(model: torch.nn.Module, entries: dict) -> tuple[dict, dict[str, str]]:
    """The checkpoint's tensors that transformers would rename or convert for ``model``,
    under the model's names: ``{name: Entry or Assembled}``; and ``{name: why not}`` for
    tensors whose conversion is not done here. Empty where there is nothing to convert."""
    try:
        return _convert(model, entries)
    # No transformers, not a transformers model, or a transformers whose conversion API differs
    # from the one used here: names as they are.
    except (ImportError, AttributeError, TypeError, ValueError):
        return {}, {}


def _convert(model: torch.nn.Module, entries: dict) -> tuple[dict, dict[str, str]]:
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    out: dict = {}
    refused: dict[str, str] = {}
    groups: dict[str, tuple] = {}  # target -> (converter, {(expert, source pattern index): entry})
    for name, entry in entries.items():
        target, pattern = rename_source_key(name, renamings, converters)
        if pattern is None:
            if target != name:
                out[target] = entry
            continue
        converter = next(c for c in converters if pattern in c.source_patterns)
        ops = [(type(op), getattr(op, "dim", None)) for op in getattr(converter, "operations", [])]
        if ops not in ([(MergeModulelist, 0)], [(MergeModulelist, 0), (Concatenate, 1)]):
            refused[target] = f"{name} needs transformers' conversion {[op.__name__ for op, _ in ops]}"
            continue
        renamed, _ = rename_source_key(name, renamings, [])  # the renamings alone
        index = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), renamed)
        if index is None or not index.groups():
            refused[target] = f"{name}: no expert number where {pattern!r} has one"
            continue
        _, parts = groups.setdefault(target, (converter, {}))
        parts[(int(index.group(1)), converter.source_patterns.index(pattern))] = entry
    for target, (converter, parts) in groups.items():
        made = _merged(target, parts, len(converter.source_patterns))
        if isinstance(made, str):
            refused[target] = made
        else:
            out[target] = made
    return out, refused


def _merged(target: str, parts: dict, projections: int) -> Assembled | str:
    """``target`` from ``parts`` ``{(expert, projection): entry}``: experts stacked, each
    expert's projections concatenated along their rows; or why it cannot be."""
    experts = 1 + max(e for e, _ in parts)
    missing = [f"expert {e} projection {k}" for e in range(experts) for k in range(projections) if (e, k) not in parts]
    if missing:
        return f"the checkpoint lacks {', '.join(missing[:3])} of {target}"
    first = [parts[(0, k)] for k in range(projections)]
    inner = first[0].shape[1:]
    if any(e.shape[1:] != inner or not e.shape for e in parts.values()):
        return f"the tensors that make {target} differ in shape beyond their first dimension"
    if any(parts[(e, k)].shape != first[k].shape for e in range(experts) for k in range(projections)):
        return f"the experts that make {target} differ in shape"
    row = math.prod(inner)
    rows = [e.shape[0] for e in first]
    assembled = Assembled(target, (experts, sum(rows), *inner))
    at = 0
    for e in range(experts):
        for k in range(projections):
            assembled.parts.append((at, parts[(e, k)]))
            at += rows[k] * row
    return assembled
