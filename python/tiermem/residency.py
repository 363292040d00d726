"""Where a whole offloaded model lives: :class:`Residency`, the part of
:class:`tiermem.torch.Offload` that pages every buffer out and in at once (sleep and wake, for
serving several models on one GPU) and that holds a model that fits resident without hooks
(pin), so that it runs at the speed of a model never offloaded.

**Why pin.** The hooks cost host time at every module — PyTorch's slow path for modules with
hooks, then a few engine calls — which the link hides while the model streams but which is
all there is once everything is resident: a small model woken to serve ran at about half its
plain speed on the H200 host. A pinned model has every buffer acquired once and its hooks
removed, so it runs exactly as an ordinary model; its HBM stays its own until :meth:`unpin`,
:meth:`sleep` or :meth:`remove`. Acquired memory is never taken away, so a pinned model keeps
one hook, on its root: an inference pass that begins under a budget smaller than the model
(the node daemon taking HBM back) unpins it first, and streams. A pass with gradients does
not: the backward of a graph built while pinned has no hooks to acquire what it reads.
"""

from __future__ import annotations

import threading

import torch

from ._tiermem import BufferStateError, InvalidArgumentError, Pool, TiermemError
from .experts import mark_experts, unmark_experts
from .units import dedup, phase_buffers


_OFFLOADED = "_tiermem_offload"  # the model's attribute naming its Offload


def _stream(device: int) -> int:
    from .torch import _stream as current  # tiermem.torch imports this module

    return current(device)


class Residency:
    """Sleep, wake, pin and unpin of an offloaded model, mixed into ``Offload``, whose
    ``model``, ``pool``, ``units``, ``sites``, ``schedule``, ``_device`` and hooks (``_hooks``,
    ``_install``, ``_pass_starts``, ``_forward_pre``, ``_experts``) it uses."""

    _pinned: tuple[list, list] | None = None  # (read, written) buffers acquired by pin()

    def _all_buffers(self) -> list:
        """Every buffer of the model (the units include fused experts cut apart)."""
        return [b for u in self.units for b in u.parts.values()]

    @property
    def bytes(self) -> int:
        """What the buffers take in tiermem: whole chunks."""
        chunk = self.pool.chunk_size
        return sum(-(-b.size // chunk) * chunk for b in self._all_buffers())

    # --- sleep and wake -------------------------------------------------------------------

    def sleep(self, release_hbm: bool = True) -> int:
        """Pages the whole model out of HBM (weights read since their last page-out are
        clean: they leave with no copy) and, with ``release_hbm``, gives the HBM the pool no
        longer uses back to the driver for other users of the GPU. Returns the bytes given
        back. A pinned model is unpinned first (so, as for :meth:`unpin`, not between a
        forward made pinned and its backward). The model still runs while asleep (it pages
        in on demand); :meth:`wake` brings it back at the PCIe link's speed."""
        self._usable("Offload.sleep")
        if any(k.held for k in self.sites + self.units):
            raise InvalidArgumentError("Offload.sleep: the model is running (a module holds its buffers)")
        self.unpin()
        tickets = [self.pool.page_out_start(b) for b in self._all_buffers()]
        for ticket in tickets:
            self.pool.finish(ticket)
        return self.pool.release_idle_hbm() if release_hbm else 0

    def wake(self, block: bool = True) -> "Waking":
        """Pages the weights in, in the order the model uses them, as far as HBM allows: every
        buffer's copies are started before any is waited for, so they overlap and run at the
        PCIe link's speed (the engine starts a page-in's copies batch by batch, so the
        physical chunks that must be made again after a sleep gave HBM back are made while
        earlier copies run). ``block=False`` returns at once; the returned :class:`Waking`
        says when the copies are done. Running the model before then is safe (it waits on
        the device for what it needs)."""
        self._usable("Offload.wake")
        order = [b for key, phase in self.schedule if phase == "forward" for b in phase_buffers(key.phase(phase))]
        order += [u.parts["weights"] for u in self.units]
        stats = self.pool.stats()
        room = stats["hbm"]["capacity_bytes"] - stats["hbm"]["used_bytes"]
        mine = {s["id"]: s["in_hbm"] * stats["chunk_size"] for s in stats["buffers"]}
        chosen, seen, chunk = [], set(), self.pool.chunk_size
        for buffer in order:
            need = -(-buffer.size // chunk) * chunk - mine.get(buffer.id, 0)
            if buffer.id in seen or need > room:
                continue
            seen.add(buffer.id)
            room -= need
            chosen.append((buffer, need))
        tickets = [self.pool.page_in_start(b) for b, _ in chosen]
        waking = Waking(self.pool, tickets, sum(need for _, need in chosen))
        if block:
            waking.wait()
        return waking

    # --- pin and unpin --------------------------------------------------------------------

    @property
    def pinned(self) -> bool:
        """Whether :meth:`pin` holds the model resident."""
        return self._pinned is not None

    def pin(self) -> None:
        """Makes the whole model resident and keeps it so, and takes its hooks away: it then
        runs as fast as a model that was never offloaded (no host work per module). For a
        model that fits in the Pool's HBM cap — one woken to serve requests, say. Weights are
        held for reading (they stay clean: a later :meth:`sleep` costs no copy), gradients
        for writing; :meth:`step` and :meth:`zero_grad` work as before. Until :meth:`unpin`
        (or :meth:`sleep`, :meth:`remove`) the HBM is the model's — unless the Pool's budget
        falls below the model (the node daemon taking HBM back, ``Pool.set_hbm_budget``): then
        the model unpins itself as its next forward without gradients begins (inference, as
        in serving), and streams from there. An idle pinned model keeps its HBM until then
        (put idle models to :meth:`sleep`), and so does one that trains: a forward that builds
        a graph left no hooks for its backward, so the model may be unpinned only between
        steps, by :meth:`unpin`, never between a forward and its backward. A model larger
        than the cap, or one that cannot be made resident now, is an error and nothing
        changes. Pinning a pinned model does nothing."""
        self._usable("Offload.pin")
        if self._pinned is not None:
            return
        if any(k.held for k in self.sites + self.units):
            raise InvalidArgumentError("Offload.pin: the model is running (a module holds its buffers)")
        held = self.bytes
        if held > self.pool.hbm_cap:
            raise InvalidArgumentError(
                f"Offload.pin: the model takes {held} bytes in chunks, more than the Pool's HBM cap of "
                f"{self.pool.hbm_cap}: only a model that fits can be pinned (it streams as it is)"
            )
        entries = dedup([e for u in self.units for e in u.phase("backward")])
        read = [b for b, write in entries if not write]
        written = [b for b, write in entries if write]
        stream, acquired = _stream(self._device), []
        try:
            for buffers, write in ((read, False), (written, True)):
                if buffers:
                    self.pool.acquire(buffers, stream, write)
                    acquired += buffers
        except BaseException as e:
            if acquired:
                self.pool.release(acquired, stream)
            if isinstance(e, TiermemError):
                raise type(e)(f"Offload.pin: {e}") from e
            raise
        self._pinned = (read, written)
        self._remove_hooks()
        for experts in self._experts():
            for owned in experts.tensors:
                unmark_experts(owned.tensor)
        # The one hook left: a pass that begins under a budget smaller than the model unpins.
        self._hooks.append(self.model.register_forward_pre_hook(lambda m, args: self._keep_to_budget(held, args)))

    def _keep_to_budget(self, held: int, args) -> None:
        # Only without gradients: a graph a pinned forward built may still await its backward.
        if held > self.pool.hbm_cap and not torch.is_grad_enabled():
            self.unpin()
            # The root's own pre-hooks, installed while its call runs, miss this call (its
            # post-hooks do not; the root is the one site with module hooks rather than a
            # wrapped forward for this reason): run them here.
            self._pass_starts()
            for site in self.sites:
                if site.module is self.model:
                    self._forward_pre(site)(self.model, args)

    def unpin(self) -> None:
        """Gives the model back to the engine: its hooks return and its buffers are released
        (on the current stream, after the work queued there), free to leave HBM again. Call it
        between steps, never between a forward made pinned and its backward (that backward
        would find no hook to acquire what it reads). Unpinning a model that is not pinned
        does nothing."""
        if self._pinned is None:
            return
        read, written = self._pinned
        self._pinned = None
        self._remove_hooks()
        for experts in self._experts():
            mark_experts(experts)
        self._install()
        stream = _stream(self._device)
        self.pool.release(read + written, stream)

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def _usable(self, call: str) -> None:
        if getattr(self.model, _OFFLOADED, None) is not self:
            raise InvalidArgumentError(f"{call}: this Offload was removed")
        if self.pool.closed:
            raise BufferStateError(f"{call}: the model's Pool is closed; offload the model into a new Pool")


class Waking:
    """A :meth:`Offload.wake` in progress: the copies finish on a background thread."""

    def __init__(self, pool: Pool, tickets: list[int], nbytes: int):
        self.bytes = nbytes
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._finish, args=(pool, tickets), name="tiermem-wake", daemon=True)
        self._thread.start()

    def _finish(self, pool: Pool, tickets: list[int]) -> None:
        for ticket in tickets:
            try:
                pool.finish(ticket)
            except BaseException as e:  # noqa: BLE001 - re-raised by wait()
                self._error = self._error or e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        """Waits for every copy; raises the first error of any."""
        self._thread.join()
        if self._error is not None:
            raise self._error
