"""Loading a safetensors checkpoint straight into tiermem buffers.

A model larger than the GPU (or than host RAM) cannot be materialised first and offloaded
after. :func:`from_pretrained` builds the model on the ``meta`` device (parameters without
storage; buffers such as rotary tables stay real, through accelerate's
``init_empty_weights(include_buffers=False)``), plans its tiermem units
(:mod:`tiermem.units`), checks the checkpoint against the model from the file headers alone,
and only then allocates and reads. :func:`load_checkpoint` does the same for a model the
caller built on ``meta``.

**What is read, and how.** Tensors are read with large ``preadv`` calls straight into
pinned staging areas (small tensors of a unit share one piece, large ones are cut at row
boundaries), in the order they lie in the files, so the disk reads sequentially; each piece
is written into its unit's buffer with one ``Buffer.write``, which copies from the staging
area without another copy. ``staging_bytes`` is cut into four areas: a thread reads up to
four pieces ahead while the main thread writes, so reading the disk and the PCIe copies
overlap, and at most ``staging_bytes`` of host RAM and a quarter of it in HBM are taken by
staging at once. Writes go through the engine: a model larger than the HBM cap spills to the
host tier (and to the file tier when the pool has one) as it loads.

**Errors leave the model as it was.** A missing path or shard, a truncated shard, a tensor
the model lacks or one it has that the checkpoint lacks, a wrong shape or a dtype the model
cannot take: each is an ``InvalidArgumentError`` naming the tensor and the file, raised before
anything is allocated (or, for a file that fails while being read, after every buffer made
so far is freed). Floating-point tensors are converted to the model's dtype; others must
match it. A tied tensor needs only one of its names in the checkpoint (transformers drops
``lm_head.weight`` when it is tied to the embedding).

**Checkpoints under other names.** Where transformers converts a checkpoint for the model
(a Mixtral's experts, saved one expert and projection at a time, are fused tensors in the
model since transformers 5), the same rules apply here and each saved tensor is read into its
place in the fused one (:mod:`tiermem.conversions`); a conversion of another kind is an error
naming the tensor.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import conversions
from ._tiermem import InvalidArgumentError, Pool
from .conversions import Assembled
from .experts import point_by_tensor
from .units import ALIGN, Unit

if TYPE_CHECKING:
    from .torch import Offload

def _tiermem_torch():
    """tiermem.torch, imported when first needed (it imports this module at its end)."""
    from . import torch as module

    return module


_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": getattr(torch, "float8_e4m3fn", None), "F8_E5M2": getattr(torch, "float8_e5m2", None),
}  # fmt: skip
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class Entry:
    """A tensor of the checkpoint: its file, dtype (None if torch has none), shape and bytes."""

    name: str
    file: Path
    dtype: torch.dtype | None
    dtype_name: str
    shape: tuple[int, ...]
    start: int  # where its bytes begin in the file
    stop: int


class Checkpoint:
    """The tensors of a safetensors checkpoint: a directory (``model.safetensors`` or
    ``model.safetensors.index.json`` with its shards), an index file, or one ``.safetensors``
    file. Opening reads only the headers and checks every file is whole."""

    def __init__(self, path: str | os.PathLike, call: str = "load_checkpoint"):
        self.call, path = call, Path(path)
        if not path.exists():
            raise InvalidArgumentError(f"{call}: {path} does not exist")
        if path.is_dir():
            self.directory = path
            if (path / INDEX).exists():
                path = path / INDEX
            elif (path / SINGLE).exists():
                path = path / SINGLE
            else:
                raise InvalidArgumentError(f"{call}: {self.directory} holds neither {SINGLE} nor {INDEX}")
        else:
            self.directory = path.parent
        self.entries: dict[str, Entry] = {}
        if path.name.endswith(".json"):
            self._read_index(path)
        else:
            self._read_header(path, None)
        self.files = sorted({e.file for e in self.entries.values()})
        self.bytes = sum(f.stat().st_size for f in self.files)

    def _read_index(self, index: Path) -> None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            assert isinstance(weight_map, dict)
        except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
            raise InvalidArgumentError(f"{self.call}: {index} is not a safetensors index (a JSON weight_map): {e}") from None
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        for shard, names in shards.items():
            file = index.parent / shard
            if not file.exists():
                raise InvalidArgumentError(f"{self.call}: {file} (a shard named by {index}) does not exist")
            self._read_header(file, names)

    def _read_header(self, file: Path, expected: list[str] | None) -> None:
        """The header of ``file`` (the safetensors format: 8 bytes of length, then JSON),
        checked against its size and, for a shard, against the names the index gives it."""
        try:
            with open(file, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 1 << 30:
                    raise ValueError(f"a header of {n} bytes")
                header = json.loads(f.read(n))
            size = file.stat().st_size
        except (OSError, ValueError, struct.error) as e:
            raise InvalidArgumentError(f"{self.call}: {file} is not a readable safetensors file: {e}") from None
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype_name, shape, (start, stop) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise InvalidArgumentError(f"{self.call}: {file}: the header entry of {name} is malformed") from None
            end = max(end, stop)
            self.entries[name] = Entry(name, file, _DTYPES.get(dtype_name), dtype_name, shape, 8 + n + start, 8 + n + stop)
        if 8 + n + end > size:
            raise InvalidArgumentError(
                f"{self.call}: {file} is truncated: it has {size} bytes, its header describes {8 + n + end}"
            )
        for name in expected or ():
            if name not in header:
                raise InvalidArgumentError(f"{self.call}: the index puts {name} in {file}, which does not hold it")


def match(call: str, units, checkpoint: Checkpoint, ignore: list[str] = (), converted: dict | None = None,
          refused: dict | None = None) -> dict[int, Entry | Assembled | None]:
    """Which checkpoint entry fills each of the units' tensors (None: keep the model's own
    value, for a real tensor the checkpoint lacks), or, where transformers converts the
    checkpoint for this model (``converted``, ``refused``: :func:`tiermem.conversions.converted`),
    which entries make it. Raises an error listing mismatches."""
    sources: dict[int, Entry | Assembled | None] = {}
    used: set[str] = set()
    errors: list[str] = []
    converted, refused = converted or {}, refused or {}
    for unit in units:
        for o in unit.tensors:
            found = [n for n in o.names if n in checkpoint.entries]
            used.update(found)
            made = next((converted[n] for n in o.names if n in converted), None)
            if not found and isinstance(made, Assembled):
                used.update(made.sources)
                sources[id(o)] = made
                if tuple(made.shape) != tuple(o.tensor.shape):
                    errors.append(f"{o.name}, made of {made.sources[0]} and the like, has shape {list(made.shape)}, the model's is {list(o.tensor.shape)}")
                errors += [err for err in (_dtype_error(e, o) for _, e in made.parts) if err][:1]
                continue
            if not found and made is not None:
                found = [made.name]
                used.add(made.name)
            if not found and o.name in refused:
                errors.append(f"{o.name} cannot be read from {checkpoint.directory}: {refused[o.name]}, which tiermem's loader does not do"
                              " (load the model with transformers, then tiermem.torch.offload it)")
                continue
            if not found:
                if o.tensor.is_meta:
                    hint = (
                        " (a buffer on the meta device: build the model with accelerate's init_empty_weights(), which keeps"
                        " buffers real; from_pretrained does so when accelerate is installed: pip install accelerate)"
                    )
                    hint = hint if o.role == "buffer" else ""
                    errors.append(f"{o.name} is missing from the checkpoint in {checkpoint.directory}{hint}")
                else:
                    sources[id(o)] = None
                continue
            e = checkpoint.entries[found[0]]
            sources[id(o)] = e
            if tuple(e.shape) != tuple(o.tensor.shape):
                errors.append(f"{e.name} in {e.file} has shape {list(e.shape)}, the model's is {list(o.tensor.shape)}")
            elif error := _dtype_error(e, o):
                errors.append(error)
    for name, e in checkpoint.entries.items():
        if name not in used and not any(re.search(p, name) for p in ignore):
            errors.append(f"{name} in {e.file} is unexpected: the model has no tensor of that name")
    if errors:
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
        raise InvalidArgumentError(f"{call}: the checkpoint does not match the model: " + "; ".join(errors[:5]) + more)
    return sources


def _dtype_error(e: Entry, o) -> str | None:
    """Why ``e`` cannot fill ``o`` for its dtype, or None (floating types convert)."""
    if e.dtype == o.tensor.dtype or (e.dtype is not None and e.dtype.is_floating_point and o.tensor.dtype.is_floating_point):
        return None
    return f"{e.name} in {e.file} is {e.dtype_name}, which the model's {o.tensor.dtype} does not accept"


@dataclass
class _Piece:
    """Bytes ``[start, start + length)`` of one buffer, made of whole tensors or rows of one."""

    buffer: object
    start: int
    length: int
    parts: list  # (offset in the piece, Owned, Entry or None, first row, end row)


def pieces(units, layouts, sources: dict[int, Entry | Assembled | None], staging: int) -> list[_Piece]:
    """Cuts the units' weights into writes of at most ``staging`` bytes: a unit's small
    tensors share one write; a tensor larger than ``staging`` is cut at row boundaries; a
    tensor made of several checkpoint tensors is written as they are, each in its place."""
    out: list[_Piece] = []
    for unit, layout in zip(units, layouts):
        buffer = unit.parts.get("weights")
        current = None
        for _, owned, offset in layout["weights"][0]:
            source = sources[id(owned)]
            size = owned.tensor.element_size()
            runs = [(offset + at * size, e, e.shape) for at, e in source.parts] if isinstance(source, Assembled) else [
                (offset, source, tuple(owned.tensor.shape))]  # fmt: skip
            for start, entry, shape in runs:
                rows = shape[0] if shape else 1
                nbytes = size * rows * (math.prod(shape[1:]) if shape else 1)
                row_bytes = max(1, nbytes // max(rows, 1))
                if nbytes <= staging:
                    if current is None or start + nbytes - current.start > staging:
                        current = _Piece(buffer, start, 0, [])
                        out.append(current)
                    current.parts.append((start - current.start, owned, entry, 0, rows))
                    current.length = start + nbytes - current.start
                    continue
                current = None
                step = max(1, staging // row_bytes)
                for r0 in range(0, rows, step):
                    r1 = min(rows, r0 + step)
                    out.append(_Piece(buffer, start + r0 * row_bytes, (r1 - r0) * row_bytes, [(0, owned, entry, r0, r1)]))
    return out


class _Reader:
    """Fills staging areas from the checkpoint's files with plain ``preadv`` calls.

    Each tensor (or run of rows) is one read straight into the staging area: the kernel reads
    ahead sequentially as for any large read, and no byte is copied on the host. (The
    ``safetensors`` library maps the file and copies out of the mapping: on a cold page cache
    that is a page fault per 4 KiB read-ahead window plus a copy, about half the disk's speed.)
    The file format was checked by :class:`Checkpoint` (offsets, sizes); safetensors is
    little-endian, as every platform PyTorch runs tiermem on. A tensor whose dtype differs from
    the model's is read into scratch memory and converted into the staging area."""

    CHUNK = 16 << 20  # bytes per read call: large and sequential, like a plain copy tool

    def __init__(self):
        self._fds: dict[Path, int] = {}

    def _fd(self, file: Path) -> int:
        fd = self._fds.get(file)
        if fd is None:
            fd = self._fds[file] = os.open(file, os.O_RDONLY)
        return fd

    def advise(self, piece: _Piece) -> None:
        """Starts the kernel reading ``piece``'s bytes (it is read next), so the disk stays busy."""
        if not hasattr(os, "posix_fadvise"):
            return
        for _, _, entry, r0, r1 in piece.parts:
            if entry is not None:
                start, stop = _span(entry, r0, r1)
                os.posix_fadvise(self._fd(entry.file), start, stop - start, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _read(self, entry: Entry, start: int, into: memoryview) -> None:
        fd, done = self._fd(entry.file), 0
        while done < len(into):
            n = os.preadv(fd, [into[done : done + self.CHUNK]], start + done)
            if n == 0:
                raise OSError(f"{entry.file} ended while reading {entry.name} (truncated since it was opened?)")
            done += n

    def fill(self, piece: _Piece, stage: torch.Tensor) -> None:
        view = memoryview(stage.numpy())
        for at, owned, entry, r0, r1 in piece.parts:
            if entry is None:
                src = owned.tensor.detach().to("cpu")
                whole = r0 == 0 and r1 == (owned.tensor.shape[0] if owned.tensor.dim() else 1)
                raw = (src if whole else src[r0:r1]).contiguous().reshape(-1).view(torch.uint8)
                stage[at : at + raw.numel()].copy_(raw)
                continue
            start, stop = _span(entry, r0, r1)
            if entry.dtype == owned.tensor.dtype:
                self._read(entry, start, view[at : at + stop - start])
                continue
            scratch = torch.empty(stop - start, dtype=torch.uint8)
            self._read(entry, start, memoryview(scratch.numpy()))
            raw = scratch.view(entry.dtype).to(owned.tensor.dtype).view(torch.uint8)
            stage[at : at + raw.numel()].copy_(raw)


def _file_order(piece: _Piece) -> tuple[str, int]:
    """Sorts pieces by where their first bytes lie in the checkpoint (pieces not read from
    it first)."""
    read = [(str(e.file), _span(e, r0, r1)[0]) for _, _, e, r0, r1 in piece.parts if e is not None]
    return min(read) if read else ("", 0)


def _span(entry: Entry, r0: int, r1: int) -> tuple[int, int]:
    """Where rows ``[r0, r1)`` of ``entry`` lie in its file."""
    rows = entry.shape[0] if entry.shape else 1
    row = (entry.stop - entry.start) // max(rows, 1)
    return entry.start + r0 * row, entry.start + r1 * row


class _Progress:
    """Bytes, GB/s and ETA on stderr, at most twice a second."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet, self.done, self.start = total, quiet, 0, time.perf_counter()
        self.shown = self.start

    def add(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if not self.quiet and (now - self.shown > 0.5 or self.done == self.total):
            self.shown = now
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate else 0.0
            print(
                f"\rtiermem: loaded {self.done / 1e9:.2f} of {self.total / 1e9:.2f} GB, {rate / 1e9:.2f} GB/s, ETA {eta:.1f} s  ",
                end="\n" if self.done == self.total else "", file=sys.stderr, flush=True,
            )  # fmt: skip

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


DEPTH = 4  # staging areas: the reader runs this many pieces ahead of the writes


def _stream_in(call: str, plan: list[_Piece], quiet: bool) -> _Progress:
    """Reads the pieces in order into :data:`DEPTH` staging areas on a thread, while the
    main thread writes the filled ones into their buffers. The reader runs ahead as far as
    the areas allow, so a write that stalls (the host tier pinning a new slab as the load
    spills past the HBM cap: hundreds of ms per GiB) does not stop the disk. The areas are
    pinned by the reader as it first needs them, so reading starts at once."""
    progress = _Progress(sum(p.length for p in plan), quiet)
    if not plan:
        return progress
    size = max(p.length for p in plan)
    pin = torch.cuda.is_available()
    reader, free, filled = _Reader(), queue.Queue(), queue.Queue()
    for _ in range(min(DEPTH, len(plan))):
        free.put(None)  # an area not made yet
    stop = threading.Event()

    def read_all() -> None:
        k = 0
        try:
            for k, piece in enumerate(plan):
                stage = free.get()
                if stop.is_set():
                    return
                if stage is None:
                    stage = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
                for ahead in plan[k + 1 : k + 3]:
                    reader.advise(ahead)
                reader.fill(piece, stage)
                filled.put((stage, None))
        except Exception as e:  # OS errors: name the file
            files = sorted({str(entry.file) for _, _, entry, _, _ in plan[k].parts if entry is not None})
            error = InvalidArgumentError(f"{call}: reading {', '.join(files)} failed: {e}")
            error.__cause__ = e
            filled.put((None, error))
        except BaseException as e:  # noqa: BLE001 - re-raised by the writer
            filled.put((None, e))

    thread = threading.Thread(target=read_all, name="tiermem-load", daemon=True)
    thread.start()
    try:
        for piece in plan:
            stage, error = filled.get()
            if error is not None:
                raise error
            piece.buffer.write(stage[: piece.length].numpy(), piece.start)
            progress.add(piece.length)
            free.put(stage)
    finally:
        stop.set()
        free.put(None)  # wakes a reader waiting for an area
        thread.join()
        reader.close()
    return progress


def load_checkpoint(
    model: torch.nn.Module,
    checkpoint: str | os.PathLike | Checkpoint,
    pool: Pool,
    prefetch_bytes: int | str = "256MiB",
    quiet: bool = False,
    staging_bytes: int | str = "256MiB",
) -> "Offload":
    """Reads ``checkpoint`` into tiermem buffers for ``model`` (its parameters on the ``meta``
    device, or real ones the checkpoint overwrites) and offloads it as :func:`offload`
    does. Returns the :class:`Offload`; its ``load_seconds`` and ``load_bytes`` say how long
    the reading took. Errors leave the model as it was (see the module docs)."""
    _tt = _tiermem_torch()
    call = "load_checkpoint" if not isinstance(checkpoint, Checkpoint) else checkpoint.call
    units, sites = _tt._prepare(call, model, pool, None, meta_ok=True, experts_apart=True, by_expert=False)
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint(checkpoint, call)
    # Fused experts cut by tensor (tiermem.units) are read as any tensor, into their own parts.
    cut = [experts for site in sites for experts in site.experts]
    whole = [Unit(u.name, [o], u.parts) for experts in cut for u, o in zip(experts.units, experts.tensors)]
    own = [u for u in units if not u.lazy]
    filled = own + whole
    ignore = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    sources = match(call, filled, checkpoint, ignore, *conversions.converted(model, checkpoint.entries))
    prefetch_bytes = _tt._size(call, "prefetch_bytes", prefetch_bytes)
    staging = min(_tt._size(call, "staging_bytes", staging_bytes), max(pool.chunk_size, pool.hbm_cap // 4)) // DEPTH
    staging = max(ALIGN, staging // ALIGN * ALIGN)
    layouts = [u.layout(False) for u in units]
    _tt._allocate(pool, units, layouts, sites=sites)
    filled_layouts = [layout for u, layout in zip(units, layouts) if not u.lazy] + [u.layout(False) for u in whole]
    try:
        plan = sorted(pieces(filled, filled_layouts, sources, staging), key=_file_order)
        progress = _stream_in(call, plan, quiet)
    except BaseException:
        _tt._free_all(units)
        raise
    for unit, layout in zip(own, filled_layouts):
        for _, owned, offset in layout["weights"][0]:
            owned.point_at(_tt._view(unit.parts["weights"], offset, owned.tensor))
    for experts in cut:
        point_by_tensor(experts)
    handle = _tt._install(model, pool, prefetch_bytes, units, sites, None)
    handle.load_seconds, handle.load_bytes = progress.seconds, progress.total
    return handle


def dtype_kwargs(dtype: torch.dtype) -> dict:
    """transformers' keyword for a model's dtype: ``dtype`` since 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


def build_on_meta(directory: str | os.PathLike, model_class=None, dtype: torch.dtype | None = None, call: str = "from_pretrained"):
    """The model a transformers checkpoint directory describes (its ``config.json``), with
    parameters on the ``meta`` device and buffers real; nothing from the hub."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{call}: no usable config.json in {directory}: {e}") from None
    if dtype is None:
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidArgumentError(f"{call}: dtype {dtype} is not a floating-point torch.dtype the model can take")
    cls = model_class or transformers.AutoModelForCausalLM
    factory = getattr(cls, "from_config", None) or cls._from_config
    kwargs = dtype_kwargs(dtype)
    try:
        from accelerate import init_empty_weights

        empty = init_empty_weights(include_buffers=False)
    except ImportError:
        empty = torch.device("meta")  # buffers on meta too: load_checkpoint names any the checkpoint lacks
    with empty:
        model = factory(config, **kwargs)
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # init_empty_weights re-creates each parameter it sees assigned, untying them
    return model.eval()


def from_pretrained(
    path: str | os.PathLike,
    pool: Pool,
    model_class=None,
    dtype: torch.dtype | None = None,
    prefetch_bytes: int | str = "256MiB",
    quiet: bool = False,
    staging_bytes: int | str = "256MiB",
) -> "Offload":
    """A transformers model from a local checkpoint (a directory with ``config.json`` and
    ``model.safetensors`` or ``model.safetensors.index.json`` and its shards), built on the
    meta device and read straight into ``pool``: see the module docs. ``model_class``: the
    class to build (default ``AutoModelForCausalLM``); ``dtype``: the parameters' dtype
    (default the config's). Progress goes to stderr unless ``quiet``. Returns the
    :class:`Offload`; the model is ``.model``."""
    _tiermem_torch()._require_gpu(pool, "from_pretrained")
    checkpoint = Checkpoint(path, "from_pretrained")
    model = build_on_meta(checkpoint.directory, model_class, dtype)
    return load_checkpoint(model, checkpoint, pool, prefetch_bytes, quiet, staging_bytes)
