"""How :mod:`tiermem.torch` cuts a model into tiermem buffers, and which modules acquire them.

A **unit** is storage: a set of tensors laid out in one tiermem buffer (``weights``), plus,
when training, a buffer for their gradients and one for Adam's moments. A **site** is a module
with hooks: when it runs it acquires the units it needs. Usually a module is both: its own
tensors are its unit, and it is its own site. Two cases make them differ:

* **Tied and shared tensors.** A tensor that several sites use (an input embedding tied to
  the output head; any tensor registered in two modules) is a unit of its own, and every site
  using it lists it: whichever runs acquires it, and the recorded schedule holds both uses,
  so the engine keeps it or brings it back in time for each. It lives once in tiermem, has one
  gradient and one pair of moments, and stays one tensor after :meth:`Offload.remove`.
* **Mixture-of-experts blocks.** Which experts run depends on the tokens, so hooks on expert
  modules would record a different schedule every pass and the engine would page ahead the
  wrong experts. A module with a child named ``experts`` (Mixtral's, Qwen-MoE's,
  DeepSeek's sparse blocks, whether their experts are a ``ModuleList`` or one fused module) is
  one site for its whole subtree, router included: the block's experts move as one step, the
  schedule is the same every pass, and streaming runs at the dense model's fraction of the
  PCIe link. The price is moving experts that a pass does not use; at decoding batch sizes
  nearly all of a layer's experts are hit anyway.
* **Fused experts that run one at a time are cut by expert.** Since transformers 5 a block's
  experts are one module whose tensors are fused (``gate_up_proj``: ``[experts, 2*mlp,
  hidden]``). Its "eager" implementation loops over the experts the tokens chose and indexes
  one at a time (``gate_up_proj[e]``); there, such tensors are laid out by expert: part ``e``
  of one reservation of consecutive addresses (``Pool.alloc_parts``) holds slice ``e`` of
  each, the fused tensor is a strided view over the parts, and each expert is a buffer (a lazy
  :class:`Unit`) that the schedule names on its own. :mod:`tiermem.experts` acquires an expert
  when the forward indexes it, and every expert for any other use of the tensor, so an
  expert streams in while the one before it computes. On the H200 this lifted an eager
  Mixtral-style decode from 0.40 to 0.47 of the PCIe bound. Only where each expert's part
  wastes at most 1/:data:`WASTE` of its bytes in rounding to whole chunks.
* **Fused experts read in one kernel are cut by tensor.** The grouped implementations
  (``grouped_mm``, transformers' default where it can run, and ``batched_mm``) read every
  expert of a fused tensor in one kernel, so cutting by expert gains nothing (0.57-0.62 of the
  PCIe bound against 0.64-0.66 whole, and 0.44 with each grouped GEMM run one expert at a
  time, whose extra launches and synchronisations cost 15 ms of host time a step;
  ``bench/results/probes-20261126/moe-experts-*``). But the block runs its fused tensors one
  after another (``gate_up_proj``, then ``down_proj``), so each is a buffer of its own (a lazy
  unit), acquired by its first use that reads data: the schedule holds the block's router,
  its up projection and its down projection as three steps. A sparse block's largest step is
  then two thirds of it, so the engine's planned resident set (which leaves room for the
  largest streamed step) keeps more, and the down projection streams in while the up
  projection computes. Only where each tensor wastes at most 1/:data:`WASTE` in rounding to
  whole chunks (a small model's tensors stay in their block's buffer).
  Neither cut when training with an optimizer (gradients and moments would need the same
  cut). Backward acquires the block whole, as before. A block implementation switched after
  :func:`offload` stays correct. (:func:`tiermem.torch.from_pretrained` cuts by tensor only:
  an eager block's experts move whole.)
* **A block holds only the parts it still reads.** When the forward reads another of its
  units, one read before that no live tensor views any more (the transposed view a grouped
  GEMM read has died with the call) is released, on the stream after the kernels that read
  it. Held to the block's end, the up projection shared HBM with the down one: a step's
  room is planned for the largest streamed step alone, so the engine evicted what it meant
  to keep, 88 MiB a pass more than the plan on the H200's 12-layer MoE decode (1.17× the
  optimum's traffic against the plan's 1.115×, ``scripts/gpu/probes/moe_traffic.py``). An
  expert whose view lives on (a forward that indexes every expert before computing, or a
  graph kept for backward) stays held until the block ends.
* **Small tensors are packed.** HBM and the link move whole chunks (4 MiB by default), so a module whose
  tensors are small (a norm's weight: 6 KB in a 3B Llama) would take a chunk of its own and
  move 300× its bytes: a 3B Llama's 25 norms took 50 MiB of HBM and streamed most of it every
  pass. Units of at most ``small`` bytes used by one site each are laid out together, in the
  order of the model, in packs of up to a chunk; each of their sites acquires its pack. A pack
  is used all through a pass, so Belady keeps it resident. A site still *uses* only its own
  tensors (``Site.uses``): backward releases it when those have their gradients.
* **Consecutive units that round up less together are merged into runs.** A unit takes whole
  chunks, so a 6 MiB ``k_proj`` takes 8 MiB of 4 MiB chunks and moves 8 every pass; with the
  6 MiB ``v_proj`` after it, the two take 12. Runs of consecutive units owned by one site each
  are laid out together while that wastes fewer bytes than apart (a 3B Llama at 4 MiB chunks:
  100 MiB of rounding down to 4), each of their sites acquiring the run, as with packs.

Everything here is pure bookkeeping on module structure (no GPU needed), so it also runs on
models whose parameters are on the ``meta`` device (:mod:`tiermem.loading`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ALIGN = 256  # bytes; every tensor in a buffer starts at a multiple of this
SMALL = 256 << 10  # bytes of weights: a unit at most this big is packed with others
PACK = 4 << 20  # bytes of weights in a pack at most (the engine's default chunk)
MERGED = 64 << 20  # bytes of weights in a run of units merged to waste less in rounding, at most
WASTE = 8  # fused experts are cut by expert only if rounding a part to chunks wastes at most 1/WASTE
EXPERTS_APART = True  # False: fused experts move with their block whole, even when eager (for comparison)

# Which of a unit's buffers each phase acquires, and whether it writes them.
PHASES = {
    "forward": (("weights", False),),
    # A module in training mode may update its buffers as it runs (BatchNorm's statistics).
    "forward_writes": (("weights", True),),
    "backward": (("weights", False), ("grads", True)),
    "step": (("weights", True), ("grads", True), ("state", True)),
}


@dataclass(eq=False)
class Owned:
    """One tensor (a parameter or a buffer) and every place the model holds it."""

    role: str  # "param" or "buffer"
    tensor: torch.Tensor
    refs: list[tuple[str, torch.nn.Module, str]]  # (qualified name, module, attribute)

    @property
    def name(self) -> str:
        return self.refs[0][0]

    @property
    def names(self) -> list[str]:
        return [n for n, _, _ in self.refs]

    def nbytes(self, dtype: torch.dtype | None = None) -> int:
        size = torch.empty((), dtype=dtype).element_size() if dtype is not None else self.tensor.element_size()
        return self.tensor.numel() * size

    def point_at(self, tensor: torch.Tensor) -> None:
        """Makes every holder of this tensor hold ``tensor`` instead (a parameter keeps its
        identity where it can, so optimizers and ties still see one object)."""
        if self.role == "buffer":
            for _, module, attr in self.refs:
                module._buffers[attr] = tensor
            self.tensor = tensor
        elif self.tensor.is_meta:  # .data cannot leave the meta device: a new Parameter
            param = torch.nn.Parameter(tensor, requires_grad=self.tensor.requires_grad)
            for _, module, attr in self.refs:
                module._parameters[attr] = param
            self.tensor = param
        else:
            self.tensor.data = tensor


@dataclass(eq=False)
class Unit:
    """Tensors in one tiermem buffer; ``parts`` maps "weights"/"grads"/"state" to buffers."""

    name: str
    tensors: list[Owned] = field(default_factory=list)
    parts: dict = field(default_factory=dict)
    held: list = field(default_factory=list)  # acquisitions not yet released (the step phase)
    lazy: bool = False  # an expert's slices (:class:`Experts`): forward acquires it only when used

    @property
    def params(self) -> list[Owned]:
        return [o for o in self.tensors if o.role == "param"]

    @property
    def weight_bytes(self) -> int:
        return sum(-(-o.nbytes() // ALIGN) * ALIGN for o in self.tensors)

    def phase(self, name: str) -> list[tuple[object, bool]]:
        return [(self.parts[part], write) for part, write in PHASES[name] if part in self.parts]

    def layout(self, training: bool) -> dict[str, tuple[list, int]]:
        """For each buffer: its ``(role, owned, offset)`` entries and its size in bytes."""
        parts: dict[str, tuple[list, int]] = {}

        def add(part, role, owned):
            entries, offset = parts.get(part, ([], 0))
            entries.append((role, owned, offset))
            parts[part] = (entries, offset + -(-owned.nbytes() // ALIGN) * ALIGN)

        for owned in self.tensors:
            add("weights", owned.role, owned)
        if training:
            for owned in self.params:
                if owned.tensor.requires_grad:
                    add("grads", "grad", owned)
                    for key in ("exp_avg", "exp_avg_sq"):
                        add("state", key, owned)
        return parts


@dataclass(eq=False)
class Site:
    """A hooked module, the tensors it uses and the units holding them, which it acquires
    when it runs (its own first)."""

    module: torch.nn.Module
    name: str
    units: list[Unit] = field(default_factory=list)
    uses: list[Owned] = field(default_factory=list)
    held: list = field(default_factory=list)
    pending_grads: int = 0
    experts: list["Experts"] = field(default_factory=list)  # fused experts cut by expert

    def phase(self, name: str) -> list[tuple[object, bool]]:
        """What the site acquires on entering ``name``: in forward, not the lazy units
        (experts are acquired as the forward uses them)."""
        return [e for unit in self.units if not (unit.lazy and name.startswith("forward")) for e in unit.phase(name)]

    @property
    def grad_params(self) -> list[Owned]:
        return [o for o in self.uses if o.role == "param" and o.tensor.requires_grad]

    @property
    def has_buffers(self) -> bool:
        return any(o.role == "buffer" for o in self.uses)

    @property
    def frozen(self) -> bool:
        """Whether the site uses tensors without a gradient, which backward may still read: a
        frozen weight (for its input's gradient), a buffer an embedding took its indices from."""
        return any(o.role == "buffer" or not o.tensor.requires_grad for o in self.uses)


@dataclass(eq=False)
class Experts:
    """A fused experts module's tensors (each ``[count, ...]``) cut apart. By expert:
    ``units[e]``'s weights buffer (a part, ``part_bytes`` long) holds slice ``e`` of
    ``tensors[i]`` at ``offsets[i]``. By tensor (``by_tensor``): ``units[i]`` holds
    ``tensors[i]`` whole. ``active``, ``entered``, ``noted`` and ``holding`` (each held unit's
    live views, as weak references) are :mod:`tiermem.torch`'s while the block runs."""

    name: str
    tensors: list[Owned]
    units: list[Unit]
    offsets: list[int]
    part_bytes: int
    by_tensor: bool = False
    active: object = None
    entered: set = field(default_factory=set)
    holding: dict = field(default_factory=dict)
    noted: int = 0

    @property
    def count(self) -> int:
        return len(self.units)

    @property
    def sizes(self) -> list[int]:
        """Each unit's bytes: every expert's part alike, or each fused tensor whole."""
        if self.by_tensor:
            return [-(-o.nbytes() // ALIGN) * ALIGN for o in self.tensors]
        return [self.part_bytes] * self.count


def _cut_experts(site: Site, owned: dict, users: dict, chunk: int, by_expert: bool = True) -> Experts | None:
    """``site``'s fused experts as :class:`Experts`: by tensor where a grouped implementation
    reads each fused tensor in one kernel, by expert where the forward indexes them one at a
    time; None where they are not fused or are shared, where a part would waste more than
    1/:data:`WASTE` in rounding to chunks, and by expert where ``by_expert`` is off (module
    docs)."""
    module = getattr(site.module, "experts", None)
    implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
    if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
        return None
    fused = [t for t in module._parameters.values() if t is not None]
    count = fused[0].shape[0] if fused and fused[0].dim() >= 2 else 0
    if count < 2 or any(t.dim() < 2 or t.shape[0] != count or users[id(t)] != [site] for t in fused):
        return None
    if implementation not in (None, "eager"):
        sizes = [owned[id(t)].nbytes() for t in fused]
        if len(fused) < 2 or any((-s % chunk) * WASTE > s for s in sizes):
            return None
        units = [Unit(owned[id(t)].name, lazy=True) for t in fused]
        return Experts(f"{site.name}.experts", [owned[id(t)] for t in fused], units, [0] * len(fused), 0, by_tensor=True)
    if not by_expert:
        return None
    offsets, at = [], 0
    for t in fused:
        offsets.append(at)
        at += -(-owned[id(t)].nbytes() // count // ALIGN) * ALIGN
    if (-at % chunk) * WASTE > at:
        return None
    units = [Unit(f"{site.name}.experts[{e}]", lazy=True) for e in range(count)]
    return Experts(f"{site.name}.experts", [owned[id(t)] for t in fused], units, offsets, at)


def is_group(module: torch.nn.Module) -> bool:
    """A mixture-of-experts block: its subtree is one site (see the module docs)."""
    return isinstance(getattr(module, "experts", None), torch.nn.Module) and "experts" in module._modules


def plan(model: torch.nn.Module, small: int | None = None, pack: int = PACK,
         experts_apart: bool = False, by_expert: bool = True) -> tuple[list[Unit], list[Site]]:
    """Units and sites for ``model``, in the order of ``named_modules``; units of at most
    ``small`` bytes (default :data:`SMALL`; 0: none) packed ``pack`` bytes at most together;
    with ``experts_apart``, fused experts cut apart (by expert into parts of whole ``pack``
    chunks unless ``by_expert`` is off, or by tensor)."""
    small = SMALL if small is None else small
    root_name = type(model).__name__
    site_of: dict[int, Site] = {}  # id(module) -> the site its tensors are acquired by
    sites: list[Site] = []
    owned: dict[int, Owned] = {}  # id(tensor) -> Owned
    users: dict[int, list[Site]] = {}  # id(tensor) -> sites using it, in order
    order: list[int] = []
    for name, module in model.named_modules():
        parent = site_of.get(id(module))
        tensors = [("param", n, t) for n, t in module._parameters.items() if t is not None]
        tensors += [("buffer", n, t) for n, t in module._buffers.items() if t is not None]
        if parent is None and (tensors or is_group(module)):
            parent = Site(module, name or root_name)
            sites.append(parent)
        if parent is not None and is_group(module):
            for sub in module.modules():
                site_of.setdefault(id(sub), parent)
        for role, attr, t in tensors:
            qualified = f"{name}.{attr}" if name else attr
            if id(t) not in owned:
                owned[id(t)] = Owned(role, t, [])
                order.append(id(t))
            owned[id(t)].refs.append((qualified, module, attr))
            if parent not in users.setdefault(id(t), []):
                users[id(t)].append(parent)
    cut: set[int] = set()  # id(tensor) of fused experts laid out by expert
    for site in sites if experts_apart else ():
        experts = _cut_experts(site, owned, users, pack, by_expert) if is_group(site.module) else None
        if experts is not None:
            site.experts.append(experts)
            cut.update(id(o.tensor) for o in experts.tensors)
    units_of: dict[int, Unit] = {}  # id(site) -> its own unit
    owner: dict[int, Site] = {}  # id(unit) -> the site whose own unit it is
    units: list[Unit] = []
    for key in order:
        o, using = owned[key], users[key]
        for site in using:
            site.uses.append(o)
        if key in cut:
            continue
        if len(using) == 1:
            unit = units_of.get(id(using[0]))
            if unit is None:
                unit = units_of[id(using[0])] = Unit(using[0].name)
                owner[id(unit)] = using[0]
                units.append(unit)
                using[0].units.insert(0, unit)
            unit.tensors.append(o)
        else:
            unit = Unit(f"shared:{o.name}", [o])
            units.append(unit)
            for site in using:
                site.units.append(unit)
    units = _packed(units, owner, small, pack) if small and pack else units
    units = _merged(units, owner, pack) if pack else units
    for site in sites:  # after packing: an expert's unit lists no tensor, but is no small one
        for experts in site.experts:
            site.units += experts.units
            units += experts.units
    return units, [s for s in sites if s.units]


def _packed(units: list[Unit], owner: dict[int, Site], small: int, pack: int) -> list[Unit]:
    """``units`` with those of at most ``small`` bytes that a site owns (``owner``: its first
    unit) laid out together, in order, in packs of at most ``pack`` bytes; each such site
    acquires the pack instead. A unit alone in its pack stays as it was."""
    groups: list[list[Unit]] = []
    out: list = []  # units, and groups of small units in their place
    for unit in units:
        size = unit.weight_bytes
        if id(unit) not in owner or size > small:
            out.append(unit)
        elif groups and sum(u.weight_bytes for u in groups[-1]) + size <= pack:
            groups[-1].append(unit)
        else:
            groups.append([unit])
            out.append(groups[-1])
    return _joined(out, owner, "pack")


def _joined(out: list, owner: dict[int, Site], kind: str) -> list[Unit]:
    """``out`` (units, and groups of units owned by sites) with each group of two or more
    laid out as one unit, named ``kind:first+n``, that each of their sites acquires instead."""
    result: list[Unit] = []
    for entry in out:
        if isinstance(entry, Unit) or len(entry) == 1:
            result.append(entry if isinstance(entry, Unit) else entry[0])
            continue
        joined = Unit(f"{kind}:{entry[0].name}+{len(entry) - 1}", [o for u in entry for o in u.tensors])
        result.append(joined)
        for unit in entry:
            owner[id(unit)].units[0] = joined
    return result


def _merged(units: list[Unit], owner: dict[int, Site], chunk: int) -> list[Unit]:
    """``units`` with runs of consecutive units that sites own (``owner``) laid out together
    where that wastes fewer bytes in rounding to whole ``chunk`` s than apart (6 + 6 MiB is 12
    MiB in 4 MiB chunks, 8 + 8 apart), up to :data:`MERGED` bytes a run; each such site
    acquires the run instead of its own unit."""
    waste = lambda size: -size % chunk  # noqa: E731
    out: list = []  # units, and runs of units in their place
    run: list[Unit] = []
    for unit in units:
        size, mine = unit.weight_bytes, id(unit) in owner
        if run:
            had = sum(u.weight_bytes for u in run)
            if mine and waste(had) and waste(had + size) < waste(had) + waste(size) and had + size <= MERGED:
                run.append(unit)
                continue
            out.append(run)
            run = []
        if mine and waste(size):
            run = [unit]
        else:
            out.append(unit)
    if run:
        out.append(run)
    return _joined(out, owner, "run")


def view(buffer, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like ``like`` over ``buffer`` bytes from ``offset`` (no copy)."""
    raw = torch.from_dlpack(buffer)  # uint8, keeps the buffer alive
    n = like.numel() * like.element_size()
    return raw[offset : offset + n].view(like.dtype).view(like.shape)


def phase_buffers(entries) -> list:
    """The buffers of a phase's entries, each once."""
    return [b for b, _ in dedup(entries)]


def dedup(entries):
    """Entries ``(buffer, write)`` with each buffer once (writing if any entry writes)."""
    out: dict[int, list] = {}
    for buffer, write in entries:
        if id(buffer) in out:
            out[id(buffer)][1] |= write
        else:
            out[id(buffer)] = [buffer, write]
    return [tuple(e) for e in out.values()]
