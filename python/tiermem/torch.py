"""PyTorch on tiermem: models larger than the GPU, streamed at close to the PCIe link.

* :func:`offload` moves a model's parameters (and buffers) into tiermem buffers, one buffer
  per module that owns tensors, one per tied (shared) tensor and one per mixture-of-experts
  block (:mod:`tiermem.units` explains why). Hooks acquire a module's buffers just before it
  runs and release them right after, on the current CUDA stream, so only what runs now must
  be in HBM. The engine records the order in which modules run on the first pass
  (``Pool.pass_begins``, ``Pool.step_enters``); from then on it knows the schedule: it pages
  ahead along it within ``prefetch_bytes`` and evicts the chunk whose next use is furthest
  away (Belady), so what fits stays resident and only the rest streams. A module that uses
  another's tensors without calling it is found on that first pass and acquires them from
  then on (:mod:`tiermem.strays`).
  With an optimizer, each module's gradients and Adam's moments get two more buffers (the
  forward pass acquires only the weights, backward the weights and gradients, the step all
  three), and :meth:`Offload.step` updates one module at a time.
* :func:`from_pretrained` and :func:`load_checkpoint` (:mod:`tiermem.loading`) build a model
  on the meta device and read its safetensors checkpoint straight into tiermem buffers: the
  model never has to fit anywhere whole.
* :meth:`Offload.sleep` pages a whole model out and gives its HBM back to other users of the
  GPU; :meth:`Offload.wake` pages it back in at the PCIe link's speed, in the background if
  asked (serving several models on one GPU); :meth:`Offload.pin` holds a model that fits
  resident without hooks, so it runs as fast as one never offloaded (:mod:`tiermem.residency`).
* :func:`offload_activations` (:mod:`tiermem.activations`) keeps tensors saved for backward in tiermem buffers, so they can
  leave HBM between forward and backward; backward prefetches them in reverse order.
* :func:`allocator` is a ``torch.cuda.memory.CUDAPluggableAllocator`` backed by a Pool (the
  C functions are exported by tiermem's own extension module).

The decisions (what to evict, what to page ahead) are the engine's; this module only tells it
what runs when.
"""

from __future__ import annotations

import itertools

import torch

from . import _tiermem
from . import state as state_module
from . import units as units_module
from ._tiermem import InvalidArgumentError, Pool, TiermemError
from .experts import fill_experts, unmark_experts
from .residency import _OFFLOADED, Residency, Waking  # noqa: F401  (Waking: re-exported)
from .strays import Strays
from .units import PHASES, Experts, Site, Unit, dedup, plan, view as _view
from .wrapping import Wrapped, hooked
_STEP_KEYS = itertools.count(1)  # the engine's keys of the steps (Offload._key)
WINDOW_SHARE = 12  # the paging-ahead window is at most this fraction of the HBM cap (Offload.window_bytes)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object made


def _stream(device: int | None = None) -> int:
    """The current CUDA stream of ``device`` (default: the current device), as a number. The
    hooks name their model's device: asking PyTorch for the current one costs 2 µs a call on
    the H200 host, as much as an engine call."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(torch.cuda.current_device() if device is None else device)
    return torch.cuda.current_stream(device).cuda_stream


def _require_gpu(pool: Pool, call: str) -> torch.device:
    if not isinstance(pool, Pool):
        raise InvalidArgumentError(f"{call}: pool must be a tiermem.Pool, not {type(pool).__name__}")
    if pool.backend != "cuda":
        raise TiermemError(
            f"{call}: needs a GPU, but the Pool runs on the simulated device"
            + (f" ({pool.fallback_reason})" if pool.fallback_reason else "")
        )
    if not torch.cuda.is_available():
        raise TiermemError(f"{call}: PyTorch sees no CUDA device")
    if pool.device >= torch.cuda.device_count():
        raise InvalidArgumentError(f"{call}: the Pool is on GPU {pool.device}, PyTorch sees {torch.cuda.device_count()}")
    return torch.device("cuda", pool.device)


def allocator(pool: Pool) -> torch.cuda.memory.CUDAPluggableAllocator:
    """A PyTorch allocator whose memory comes from ``pool``. Use it through a memory pool,
    which caches and splits its segments::

        mem = torch.cuda.MemPool(tiermem.torch.allocator(pool).allocator())
        with torch.cuda.use_mem_pool(mem):
            x = torch.empty(...)

    Allocations stay resident while they live (PyTorch may pass them to any kernel).
    A failed allocation is reported by PyTorch as out of memory; :func:`allocator_error`
    gives tiermem's reason.
    """
    _require_gpu(pool, "allocator")
    _tiermem.set_allocator_pool(pool)
    return torch.cuda.memory.CUDAPluggableAllocator(_tiermem.__file__, "tiermem_torch_malloc", "tiermem_torch_free")


def allocator_error() -> str | None:
    """Why the last allocation or free through :func:`allocator` failed (then cleared)."""
    return _tiermem.allocator_error()


def _check_tensor(call: str, where: str, t: torch.Tensor, device: torch.device, meta_ok: bool = False) -> None:
    if t.is_sparse or t.layout != torch.strided:
        raise InvalidArgumentError(f"{call}: {where} is sparse ({t.layout}); only dense tensors can be offloaded")
    if not t.is_contiguous():
        raise InvalidArgumentError(f"{call}: {where} is not contiguous; call .contiguous() on it first")
    if t.is_meta and not meta_ok:
        raise InvalidArgumentError(f"{call}: {where} is on the meta device (load it with tiermem.torch.load_checkpoint)")
    if t.device.type not in ("cpu", "cuda", "meta") or (t.is_cuda and t.device.index not in (None, device.index)):
        raise InvalidArgumentError(f"{call}: {where} is on {t.device}, but the Pool is on {device}")


class Offload(Residency):
    """What :func:`offload` returns: the hooks, the recorded schedule, the units and sites.

    Not thread-safe: run the model from one thread (a :class:`Waking` may finish meanwhile).
    """

    def __init__(self, model, pool: Pool, prefetch_bytes: int, units: list[Unit], sites: list[Site], optimizer):
        self.model, self.pool, self.prefetch_bytes = model, pool, prefetch_bytes
        self.units, self.sites, self.optimizer = units, sites, optimizer
        self._keys: dict[tuple[int, str], int] = {}  # (id(site or unit), phase) -> its step key
        self._named: dict[int, tuple[object, str]] = {}  # step key -> (site or unit, phase)
        # (id(site or unit), phase) -> (step key, buffers, entries); fixed once offloaded.
        self._steps: dict[tuple[int, str], tuple[int, list, list]] = {}
        self._backward_pending = False
        self._recording = True  # the engine is recording this pass's steps (_pass_starts)
        self._running: list[Site] = []  # the sites whose forward is running, innermost last
        self._owner: dict[int, tuple[Unit, object]] = {}  # id(tensor) -> (unit, Owned): strays.py
        self._users: dict[int, list[Site]] = {}  # id(Owned) -> the sites using it
        self._watch: Strays | None = None  # over the forward of a pass being recorded
        self.strays: list[tuple[str, str]] = []  # (site, tensor) adopted by strays.py
        self._hooks = []
        self._state_hooks = []  # tiermem.state's, for model.state_dict()
        self._device = pool.device  # whose current stream the hooks acquire on
        self._window = self.window_bytes  # read again as each pass starts (the cap may change)

    # --- schedule -------------------------------------------------------------------------
    # The engine records the order in which the steps run on the first pass and finds each
    # step in it on later passes (Pool.pass_begins, Pool.step_enters); this only names them.
    # Models offloaded into one Pool each get a schedule of their own (their keys differ).

    def _pass_starts(self) -> None:
        """A root forward begins: the previous pass, if recorded, becomes the schedule."""
        self.pool.pass_begins()
        self._window = self.window_bytes
        self._running.clear()  # a forward that raised may have left its sites
        if self._recording:  # asked only until this model's pass is recorded, not every pass
            self._recording = not any(k in self._named for k in self.pool.recorded_steps)
        if self._recording and self._watch is None:
            self._watch = Strays(self)
            self._watch.__enter__()

    def _root_site(self) -> Site:
        """A site for the model itself, made during its forward (strays.py)."""
        root = Site(self.model, "(model)")
        self.sites.append(root)
        self._hooks += [self.model.register_forward_pre_hook(self._forward_pre(root)),
                        self.model.register_forward_hook(self._forward_post(root))]  # fmt: skip
        root.held.append([])  # as if entered: this forward's adoptions are released as it ends
        self._running.insert(0, root)
        return root

    def _pass_ends(self) -> None:
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self._watch = None

    def _adopt(self, unit: Unit, owned) -> None:
        """The running module used ``owned``, a tensor of another module's that no running
        module holds (strays.py): it is acquired now, held with the innermost running site (the
        model's own, made now if there is none), and from now on that site's."""
        site = self._running[-1] if self._running else self._root_site()
        buffer = unit.parts["weights"]
        writes = site.module.training and any(o.role == "buffer" for o in unit.tensors)
        self.pool.acquire(buffer, _stream(self._device), writes)
        site.held[-1].append(buffer)
        self.pool.step_also_uses([buffer])
        if unit not in site.units:
            site.units.append(unit)
            site.uses += [o for o in unit.tensors if not any(o is u for u in site.uses)]
            for o in unit.params:
                self._users.setdefault(id(o), []).append(site)
            for phase in PHASES:  # each phase's buffers are looked up again
                self._steps.pop((id(site), phase), None)
            self.strays.append((site.name, owned.name))

    def _key(self, key, phase: str) -> int:
        """The engine's key for ``(key, phase)``: a number unique in the process, so that two
        models in one Pool never name each other's steps."""
        found = self._keys.get((id(key), phase))
        if found is None:
            found = self._keys[(id(key), phase)] = next(_STEP_KEYS)
            self._named[found] = (key, phase)
        return found

    def _enter(self, key, phase: str) -> None:
        step = self._steps.get((id(key), phase))
        if step is None:
            entries = dedup(key.phase(phase))
            name = "forward" if phase == "forward_writes" else phase  # one step in train and eval
            step = self._steps[(id(key), phase)] = (self._key(key, name), [b for b, _ in entries], entries)
        number, buffers, entries = step
        self.pool.step_enters(number, buffers, self._window)
        stream, acquired = _stream(self._device), []
        try:
            for buffer, write in entries:
                self.pool.acquire(buffer, stream, write)
                acquired.append(buffer)
        except BaseException:
            if acquired:
                self.pool.release(acquired, stream)
            raise
        key.held.append(acquired)

    def _use_experts(self, site: Site, experts: Experts, wanted) -> None:
        """The running block's forward reads units ``wanted`` of its cut experts: each is
        acquired unless held (the first time as a step of the schedule) and held with the
        block's own buffers. Units held for earlier reads that this one does not want, and that
        no live tensor views any more, are released first (on the stream, after the kernels
        already queued that read them): a block reads its experts one after another (a grouped
        implementation the fused up projection, then the down one), so it needs HBM for the
        largest, not for all of them at once. A unit read again later is acquired again."""
        stream = _stream(self._device)
        for k in [k for k, views in experts.holding.items() if k not in wanted and not any(v() is not None for v in views)]:
            del experts.holding[k]
            buffer = experts.units[k].parts["weights"]
            held = site.held[-1]
            del held[next(i for i, b in enumerate(held) if b is buffer)]
            self.pool.release(buffer, stream)
        for k in wanted:
            if k in experts.holding:
                continue
            unit = experts.units[k]
            buffer = unit.parts["weights"]
            if k not in experts.entered:
                if self._recording:
                    self._note_skipped(experts, k)
                experts.entered.add(k)
                self.pool.step_enters(self._key(unit, "forward"), [buffer], self._window)
            self.pool.acquire(buffer, stream, False)
            site.held[-1].append(buffer)
            experts.holding[k] = []

    def _note_skipped(self, experts: Experts, upto: int) -> None:
        """While the first pass is recorded, the experts before ``upto`` that this pass has
        skipped are noted as steps (a step entered while recording pages nothing in), so the
        schedule holds every expert in order whichever ones the recording pass's tokens chose."""
        for k in range(experts.noted, upto):
            if k not in experts.entered:
                unit = experts.units[k]
                self.pool.step_enters(self._key(unit, "forward"), [unit.parts["weights"]], self._window)
        experts.noted = max(experts.noted, upto + 1)

    def _exit(self, key) -> None:
        if key.held:
            acquired = key.held.pop()
            if acquired:
                self.pool.release(acquired, _stream(self._device))

    # --- hooks ----------------------------------------------------------------------------

    def _install(self) -> None:
        self._hooks.append(self.model.register_forward_pre_hook(lambda m, a: self._pass_starts()))
        for site in self.sites:
            before, after = self._forward_pre(site), self._forward_post(site)
            if site.module is self.model:  # the root's pass check may install hooks during its call
                self._hooks += [site.module.register_forward_pre_hook(before), site.module.register_forward_hook(after)]
            else:
                self._hooks.append(Wrapped(site.module, "forward", hooked(site.module, before, after)))
        self._hooks.append(self.model.register_forward_hook(lambda m, a, o: self._pass_ends(), always_call=True))
        self._users = {}  # made again when a pinned model is unpinned
        for site in self.sites:
            for owned in site.uses:
                self._users.setdefault(id(owned), []).append(site)
        fused = [o for experts in self._experts() for o in experts.tensors if o.role == "param"]
        for owned in [o for unit in self.units for o in unit.params] + fused:
            if owned.tensor.requires_grad:
                hook = self._grad_done(self._users.setdefault(id(owned), []))
                self._hooks.append(owned.tensor.register_post_accumulate_grad_hook(hook))
        self._owner = {id(o.tensor): (unit, o) for unit in self.units if not unit.lazy for o in unit.tensors}

    def _experts(self) -> list[Experts]:
        return [experts for site in self.sites for experts in site.experts]

    def _forward_pre(self, site: Site):
        def hook(module, args):
            # In training mode a module may write its buffers (BatchNorm's running statistics):
            # acquired for writing, they are copied down when they leave HBM, not dropped.
            self._enter(site, "forward_writes" if module.training and site.has_buffers else "forward")
            self._running.append(site)
            for experts in site.experts:
                experts.active, experts.entered, experts.noted, experts.holding = (self, site), set(), 0, {}

        return hook

    def _forward_post(self, site: Site):
        def hook(module, args, output):
            for experts in site.experts:
                if self._recording:
                    self._note_skipped(experts, experts.count)
                experts.active, experts.holding = None, {}
            if self._running and self._running[-1] is site:
                self._running.pop()
            self._exit(site)
            if torch.is_grad_enabled() and (site.grad_params or site.frozen):
                first = _first_grad_tensor(output)
                if first is not None:
                    # Backward reads a site's tensors without gradients too (a frozen layer's
                    # weight, to pass the gradient on to its input): such a site is held until
                    # its input's gradient is complete as well, or until backward ends (an
                    # input that is a leaf would keep the hook beyond the pass).
                    upstream = _first_grad_tensor(args) if site.frozen else None
                    upstream = upstream if upstream is not None and upstream.grad_fn is not None else None
                    first.register_hook(self._backward_pre(site, upstream is not None))
                    if upstream is not None:
                        upstream.register_hook(lambda grad: self._done_with(site))

        return hook

    def _backward_pre(self, site: Site, upstream: bool):
        def hook(grad):
            if not self._backward_pending:
                self._backward_pending = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            site.pending_grads = len(site.grad_params) + upstream
            self._enter(site, "backward")
            return grad

        return hook

    def _grad_done(self, users: list[Site]):
        """A parameter's gradient is complete: sites whose gradients all are (and whose input's,
        if they are frozen) release them (a tied tensor's gradient completes once, after all its
        uses)."""

        def hook(param):
            for site in users:
                self._done_with(site)

        return hook

    def _done_with(self, site: Site) -> None:
        """One of the gradients ``site`` waits for in backward is complete; the last releases it."""
        if site.pending_grads > 0:
            site.pending_grads -= 1
            if site.pending_grads == 0:
                self._exit(site)

    def _backward_done(self) -> None:
        """End of a backward pass: release what a parameter without a gradient (an expert no
        token chose, say) left held."""
        self._backward_pending = False
        for site in self.sites:
            site.pending_grads = 0
            while site.held:
                self._exit(site)

    # --- training -------------------------------------------------------------------------

    def step(self) -> None:
        """``optimizer.step()``, one unit at a time, each with its buffers acquired; then
        zeroes that unit's gradients while it is still resident (so no separate pass is
        needed to zero them). A tied tensor is updated once."""
        if self.optimizer is None:
            raise InvalidArgumentError("Offload.step: offload() was given no optimizer")
        groups = [list(g["params"]) for g in self.optimizer.param_groups]
        try:
            for unit in self.units:
                mine = {id(o.tensor) for o in unit.params}
                for g, params in zip(self.optimizer.param_groups, groups):
                    g["params"] = [p for p in params if id(p) in mine]
                if not any(g["params"] for g in self.optimizer.param_groups):
                    continue
                self._enter(unit, "step")
                try:
                    self.optimizer.step()
                    for o in unit.params:
                        if o.tensor.grad is not None:
                            o.tensor.grad.zero_()
                finally:
                    self._exit(unit)
        finally:
            for g, params in zip(self.optimizer.param_groups, groups):
                g["params"] = params

    def zero_grad(self) -> None:
        """Zeroes the gradients in place (they live in tiermem: never set them to None)."""
        for unit in self.units:
            if "grads" in unit.parts:
                with self.pool.acquired([unit.parts["grads"]], _stream(self._device), write=True):
                    for o in unit.params:
                        if o.tensor.grad is not None:
                            o.tensor.grad.zero_()

    def remove(self, device: str | torch.device = "cpu") -> None:
        """Undoes :func:`offload`: copies every parameter, buffer, gradient and optimizer
        moment out to ordinary tensors on ``device`` (a tied tensor stays one tensor), removes
        the hooks and the schedule, and lets the tiermem buffers go. The model can then be
        offloaded again. A pinned model is unpinned first."""
        self.unpin()
        stream = _stream(self._device)
        for experts in self._experts():
            with self.pool.acquired([u.parts["weights"] for u in experts.units], stream, write=False):
                for o in experts.tensors:
                    unmark_experts(o.tensor)
                    o.tensor.data = o.tensor.data.to(device, copy=True, memory_format=torch.contiguous_format)
                torch.cuda.current_stream().synchronize()
        for unit in self.units:
            with self.pool.acquired(list(unit.parts.values()), stream, write=False):
                for o in unit.tensors:
                    p = o.tensor
                    if o.role == "buffer":
                        o.point_at(p.to(device, copy=True))
                        continue
                    p.data = p.data.to(device, copy=True)
                    if p.grad is not None and "grads" in unit.parts:
                        p.grad = p.grad.to(device, copy=True)
                    state = self.optimizer.state.get(p, {}) if self.optimizer is not None else {}
                    for key in ("exp_avg", "exp_avg_sq"):
                        if key in state:
                            state[key] = state[key].to(device, copy=True)
                torch.cuda.current_stream().synchronize()
        self._remove_hooks()
        for handle in self._state_hooks:
            handle.remove()
        self._state_hooks = []
        self.pool.forget_steps(list(self._named))  # this model's schedule; other models keep theirs
        self._steps.clear()  # each step's buffers, looked up once: they must go too
        for unit in self.units:
            _REGISTERED.discard(unit.parts["weights"].ptr)
            # Dropped, not freed: a tensor still viewing a buffer (a saved activation of an
            # old graph, say) keeps it alive, and it is freed with the last such tensor.
            unit.parts.clear()
        delattr(self.model, _OFFLOADED)

    @property
    def window_bytes(self) -> int:
        """The window the engine pages ahead in: ``prefetch_bytes``, but at most
        1/:data:`WINDOW_SHARE` of the HBM cap (and at least a chunk). Every byte of window is a
        byte of HBM the resident set gives up, so it streams once more every pass, and a large
        one evicts what Belady would keep (a tied Llama's embedding, after every lookup). With
        the resident set spread along the pass (schedule.rs) a short window keeps the link busy."""
        return min(self.prefetch_bytes, max(self.pool.chunk_size, self.pool.hbm_cap // WINDOW_SHARE))

    @property
    def schedule(self) -> list[tuple[object, str]]:
        """The recorded schedule: ``(site or unit, phase)`` per step (empty until the second
        pass begins)."""
        return [self._named[k] for k in self.pool.recorded_steps if k in self._named]

    @property
    def schedule_length(self) -> int:
        return len(self.schedule)


def _first_grad_tensor(output):
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, (tuple, list)):
        for o in output:
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    if hasattr(output, "values") and callable(output.values):  # ModelOutput and dicts
        for o in output.values():
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    return None


def _size(call: str, name: str, value) -> int:
    """``value`` (bytes, or a string such as ``"256MiB"``) as bytes; a bad one is an error
    naming the call and the argument."""
    try:
        return _tiermem.parse_size(value)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{call}: {name}: {str(e).removeprefix('size: ')}") from None


def _prepare(call: str, model: torch.nn.Module, pool: Pool, optimizer, meta_ok: bool = False, experts_apart: bool = False,
             by_expert: bool = True):
    """Checks the model and plans its units (fused experts cut by expert with
    ``experts_apart``: :mod:`tiermem.units`); allocates nothing. Returns (units, sites)."""
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"{call}: the model is a {type(model).__name__}, not a torch.nn.Module")
    device = _require_gpu(pool, call)
    if getattr(model, _OFFLOADED, None) is not None:
        raise InvalidArgumentError(f"{call}: this model is already offloaded (Offload.remove() first)")
    if optimizer is not None and type(optimizer).__name__ not in ("Adam", "AdamW"):
        raise InvalidArgumentError(f"{call}: optimizer state in tiermem supports Adam and AdamW, not {type(optimizer).__name__}")
    apart = experts_apart and optimizer is None and units_module.EXPERTS_APART
    units, sites = plan(model, pack=pool.chunk_size, experts_apart=apart, by_expert=by_expert)
    fused = [o for site in sites for experts in site.experts for o in experts.tensors]
    for o in [o for unit in units for o in unit.tensors] + fused:
        _check_tensor(call, o.name, o.tensor, device, meta_ok)
    if optimizer is not None:
        owned = {id(o.tensor) for u in units for o in u.params}
        stray = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in owned]
        if stray:
            raise InvalidArgumentError(f"{call}: the optimizer has {len(stray)} parameters that are not the model's")
        if any(optimizer.state.get(p) for g in optimizer.param_groups for p in g["params"]):
            raise InvalidArgumentError(f"{call}: the optimizer has already stepped; offload before the first step")
    return units, sites


def _allocate(pool: Pool, units: list[Unit], layouts: list[dict], in_place: bool = False, sites: list[Site] = ()) -> None:
    """One tiermem buffer per part of each unit, and for the sites' fused experts one part
    of a reservation per expert or fused tensor (``Pool.alloc_parts``); on failure none is
    left."""
    try:
        for unit, layout in zip(units, layouts):
            for part, (_, size) in layout.items():
                unit.parts[part] = pool.alloc(size, name=f"{unit.name}.{part}", in_place=in_place)
        for experts in (e for site in sites for e in site.experts):
            parts = pool.alloc_parts(experts.sizes, name=experts.name, in_place=in_place)
            for unit, part in zip(experts.units, parts):
                unit.parts["weights"] = part
    except BaseException:
        _free_all(units)
        raise


def _free_all(units: list[Unit]) -> None:
    for unit in units:
        for buffer in unit.parts.values():
            buffer.free()
        unit.parts.clear()


def _install(model, pool: Pool, prefetch_bytes: int, units, sites, optimizer) -> Offload:
    for unit in units:
        _REGISTERED.add(unit.parts["weights"].ptr)
    handle = Offload(model, pool, int(prefetch_bytes), units, sites, optimizer)
    handle._install()
    handle._state_hooks = state_module.install(handle)  # model.state_dict() reads acquired
    setattr(model, _OFFLOADED, handle)
    return handle


def offload(model: torch.nn.Module, pool: Pool, prefetch_bytes: int | str = "256MiB", optimizer=None,
            in_place: bool = False) -> Offload:
    """Moves ``model``'s parameters and buffers into ``pool`` (one buffer per module that owns
    tensors, one per tied tensor, one per mixture-of-experts block, modules with small tensors
    packed together a chunk at a time: :mod:`tiermem.units`)
    and hooks the modules so a buffer is acquired only while a module using it runs.
    Parameters stay ``nn.Parameter``s; tied parameters stay one. ``prefetch_bytes``: how far
    ahead of the running module the engine pages in, once the first pass has recorded the
    order (at most a twelfth of the HBM cap: :attr:`Offload.window_bytes`). With an Adam or AdamW ``optimizer``, gradients and the optimizer's moments live in
    the buffers too; call :meth:`Offload.step` and :meth:`Offload.zero_grad` instead of the
    optimizer's. ``in_place``: modules read their parameters where they lie in a neighbour
    GPU's lent HBM, over NVLink, instead of copying them in first (no effect without lenders).

    Errors (the model is left unchanged): a model already offloaded, tensors on another
    device or on the meta device, sparse or non-contiguous tensors, a Pool without a GPU.
    """
    units, sites = _prepare("offload", model, pool, optimizer, experts_apart=True)
    prefetch_bytes = _size("offload", "prefetch_bytes", prefetch_bytes)
    layouts = [u.layout(optimizer is not None) for u in units]
    _allocate(pool, units, layouts, in_place, sites)
    # From here on nothing can fail for a reason of the model's: copy and swap.
    stream = _stream()
    for unit, layout in zip(units, layouts):
        for part, (entries, _) in layout.items():
            _fill(pool, unit.parts[part], entries, optimizer, stream)
    for experts in (e for site in sites for e in site.experts):
        fill_experts(pool, experts, stream)
    torch.cuda.current_stream().synchronize()
    return _install(model, pool, prefetch_bytes, units, sites, optimizer)


def _fill(pool: Pool, buffer, entries, optimizer, stream: int) -> None:
    """Copies the entries' tensors into ``buffer`` (zeros for gradients and moments) and
    points the model, the parameters' gradients and the optimizer's state at the copies."""
    with pool.acquired(buffer, stream, write=True):
        for role, owned, offset in entries:
            view = _view(buffer, offset, owned.tensor)
            if role in ("param", "buffer"):
                view.copy_(owned.tensor.detach())
                owned.point_at(view)
            elif role == "grad":
                view.zero_()
                owned.tensor.grad = view
            else:
                view.zero_()
                state = optimizer.state[owned.tensor]
                state.setdefault("step", torch.tensor(0.0))
                state[role] = view


_REGISTERED: set[int] = set()  # device addresses of buffers holding offloaded parameters


from .activations import offload_activations  # noqa: E402  (it uses this module)
from .loading import from_pretrained, load_checkpoint  # noqa: E402  (loading uses this module)
