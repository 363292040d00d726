"""Fused experts cut apart (tiermem.experts) on the CPU, with test_torch_cpu.py's stand-in
Pool: a block holds only the units it still reads. Once the forward reads another unit, one
that no live tensor views is released (a grouped block needs HBM for its up projection or
its down projection, not both); one still viewed stays held. A strict pool turns memory not
acquired into NaN, so identical outputs prove nothing is read after its release."""

import types

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402
from test_torch_cpu import IDS, FakePool, cpu, mixtral  # noqa: E402, F401  (cpu: a fixture)


def _held_with(pool, watched: set) -> list[tuple[int, set]]:
    """Wraps ``pool.acquire`` to record, at each acquire of a watched buffer, the watched
    buffers held then (besides it)."""
    seen, acquire = [], pool.acquire

    def recording(buffers, stream=0, write=False):
        for b in buffers if isinstance(buffers, list) else [buffers]:
            if b.id in watched:
                seen.append((b.id, {i for i in watched if pool.acq.get(i, 0) > 0 and i != b.id}))
        acquire(buffers, stream, write)

    pool.acquire = recording
    return seen


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
def test_a_block_releases_the_experts_it_has_read_once_it_reads_others(cpu, monkeypatch, implementation):
    monkeypatch.setattr(tiermem.units, "WASTE", 0)  # cut however much rounding wastes
    ref, m = mixtral(), mixtral()
    for model in (ref, m):
        model.config._experts_implementation = implementation
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    cut = [s for s in h.sites if s.experts][0].experts[0]
    ids = [u.parts["weights"].id for u in cut.units]
    seen = _held_with(pool, set(ids))
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(m(IDS).logits, ref(IDS).logits)
    assert seen and all(not others for _, others in seen), f"a unit was acquired while another was held: {seen}"
    assert all(v == 0 for v in pool.acq.values()), pool.acq


def test_an_expert_still_viewed_stays_held_until_the_block_ends(cpu, monkeypatch):
    """A forward that indexes every expert first and computes afterwards keeps views of all
    of them alive: none may be released before the block ends."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)

    def views_first(self, hidden, top_k_index, top_k_weights):
        ups = [self.gate_up_proj[e] for e in range(self.num_experts)]
        downs = [self.down_proj[e] for e in range(self.num_experts)]
        out = torch.zeros_like(hidden)
        for e in range(self.num_experts):
            chosen = (top_k_index == e).to(hidden.dtype) * top_k_weights
            gate, up = torch.nn.functional.linear(hidden, ups[e]).chunk(2, dim=-1)
            out += torch.nn.functional.linear(self.act_fn(gate) * up, downs[e]) * chosen.sum(-1, keepdim=True)
        return out

    ref, m = mixtral(), mixtral()
    for model in (ref, m):
        model.config._experts_implementation = "eager"
        for layer in model.model.layers:
            layer.mlp.experts.forward = types.MethodType(views_first, layer.mlp.experts)
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    cut = [s for s in h.sites if s.experts][0].experts[0]
    assert not cut.by_tensor and cut.count == 4
    seen = _held_with(pool, {u.parts["weights"].id for u in cut.units})
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(m(IDS).logits, ref(IDS).logits)
    assert max(len(others) for _, others in seen) == 3, "every expert is held while all are viewed"
    assert all(v == 0 for v in pool.acq.values()), pool.acq


def test_training_through_released_experts_gives_the_same_gradients(cpu, monkeypatch):
    """With gradients the graph keeps what backward needs; backward acquires the block again."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)
    ref, m = mixtral(), mixtral()
    for model in (ref, m):
        model.config._experts_implementation = "grouped_mm"
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    for model in (ref, m):
        model(IDS, labels=IDS).loss.backward()
    for (name, a), b in zip(ref.named_parameters(), m.parameters()):
        assert torch.equal(a.grad, b.grad), name
    assert all(v == 0 for v in pool.acq.values()), pool.acq
    h.remove()
