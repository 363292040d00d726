"""tiermem.torch's sleep, wake, pin and unpin (tiermem.residency) on the CPU, with
test_torch_cpu.py's stand-in Pool: every buffer moves, a pinned model runs with no hook but
its budget check and gives the resident outputs, unpins when the budget falls below it, two
models take turns in one Pool, and errors leave the model as it was."""

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402
from test_torch_cpu import IDS, FakePool, cpu, llama, mixtral, packing  # noqa: E402, F401  (cpu, packing: fixtures)
from tiermem import experts as experts_module  # noqa: E402


@pytest.mark.parametrize("make", [lambda: llama(True), mixtral], ids=["tied", "moe"])
def test_sleep_and_wake_move_every_buffer_the_fused_experts_too(cpu, monkeypatch, make):
    monkeypatch.setattr(tiermem.units, "WASTE", 0)  # fused experts cut apart, however small
    m = make()
    pool = FakePool()
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    assert any(s.experts for s in h.sites) == isinstance(m, transformers.MixtralForCausalLM)
    with torch.no_grad():
        m(IDS)
    h.sleep()
    assert sorted(pool.paged_out) == sorted(pool.buffers), "every buffer of the model leaves HBM"
    h.wake()
    assert sorted(pool.paged_in) == sorted(pool.buffers), "the model fits: every buffer comes back"
    assert h.bytes == sum(-(-b.size // pool.chunk_size) * pool.chunk_size for b in pool.buffers.values())


def _hooked(m) -> int:
    """Module hooks and wrapped forwards (tiermem.torch wraps its sites' forwards)."""
    return sum(len(mod._forward_pre_hooks) + len(mod._forward_hooks) + ("forward" in mod.__dict__) for mod in m.modules())


@pytest.mark.parametrize("make", [lambda: llama(True), lambda: llama(False), mixtral], ids=["tied", "untied", "moe"])
def test_a_pinned_model_runs_without_hooks_and_gives_the_resident_outputs(cpu, monkeypatch, packing, make):
    """A strict pool turns memory not acquired into NaN: pinned, with no hook left to acquire
    anything, the outputs stay the resident model's; unpinned, the hooks are back."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)  # fused experts cut apart, however small
    ref, m = make(), make()
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    hooks = _hooked(m)
    with torch.no_grad():
        e = ref(IDS).logits
        assert torch.equal(m(IDS).logits, e)
        h.pin()
        h.pin()  # a second pin does nothing
        assert h.pinned and _hooked(m) == 1, "the root's check of the budget alone"
        assert all(pool.acq.get(i) == 1 for i in pool.buffers), "every buffer held once"
        assert not any(isinstance(p, experts_module.ExpertWeights) for p in m.parameters())
        for _ in range(2):
            assert torch.equal(m(IDS).logits, e)
        kw = dict(max_new_tokens=4, do_sample=False)
        assert torch.equal(m.generate(IDS, **kw), ref.generate(IDS, **kw))
        h.unpin()
        h.unpin()
        assert not h.pinned and _hooked(m) == hooks
        assert all(v == 0 for v in pool.acq.values()), pool.acq
        assert torch.equal(m(IDS).logits, e)
        h.pin()
    h.sleep()  # unpins first
    assert not h.pinned and all(v == 0 for v in pool.acq.values())
    h.pin()
    h.remove()  # unpins first
    assert _hooked(m) == 0 and all(v == 0 for v in pool.acq.values())
    with torch.no_grad():
        assert torch.equal(m(IDS).logits, e)


def test_a_pinned_model_unpins_itself_when_the_budget_falls_below_it(cpu):
    """The node daemon takes HBM back by lowering the Pool's budget: a pinned model gives its
    buffers back to the engine as its next forward begins, and that forward streams."""
    ref, m = llama(True), llama(True)
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    hooks = _hooked(m)
    with torch.no_grad():
        e = ref(IDS).logits
        h.pin()
        pool.hbm_cap = h.bytes  # still fits: stays pinned
        assert torch.equal(m(IDS).logits, e) and h.pinned
        pool.hbm_cap = h.bytes - pool.chunk_size
        with torch.enable_grad():  # a graph for a backward that would find no hooks: stays pinned
            assert torch.equal(m(IDS).logits, e) and h.pinned
        assert torch.equal(m(IDS).logits, e), "the unpinned pass acquires what it reads"
        assert not h.pinned and _hooked(m) == hooks
        assert all(v == 0 for v in pool.acq.values()), pool.acq
        assert torch.equal(m(IDS).logits, e)


class _RootOwns(torch.nn.Module):
    """A model whose root module owns a parameter itself (a site of its own)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.scale = torch.nn.Parameter(torch.randn(64))
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_a_root_that_owns_tensors_acquires_them_when_it_unpins_mid_call(cpu):
    ref, m = _RootOwns(), _RootOwns()
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    assert any(site.module is m for site in h.sites)
    x = torch.randn(4, 64)
    with torch.no_grad():
        h.pin()
        pool.hbm_cap = 0
        assert torch.equal(m(x), ref(x))
    assert not h.pinned and all(v == 0 for v in pool.acq.values()), pool.acq


def test_two_models_take_turns_in_one_pool_woken_pinned_and_put_to_sleep(cpu):
    """bench/torch_serving.py's turns: each model, woken and pinned, gives its own outputs."""
    refs, models = [llama(True, seed=s) for s in (4, 5)], [llama(True, seed=s) for s in (4, 5)]
    pool = FakePool(strict=True)
    handles = [tt.offload(m, pool, prefetch_bytes=1 << 20) for m in models]
    mine = [{b.id for u in h.units for b in u.parts.values()} for h in handles]
    with torch.no_grad():
        expected = [r(IDS).logits for r in refs]
        for h in handles:
            h.sleep(release_hbm=False)
        for turn in range(4):
            which = turn % 2
            pool.paged_in.clear()
            handles[which].wake()
            assert set(pool.paged_in) == mine[which], "the woken model's buffers, only"
            handles[which].pin()
            assert torch.equal(models[which](IDS).logits, expected[which])
            handles[which].sleep(release_hbm=False)
            assert not handles[which].pinned and all(v == 0 for v in pool.acq.values())


def test_a_pinned_model_trains_to_the_same_losses(cpu):
    def train(pinned):
        m = llama(True).train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        pool = FakePool(strict=True)
        h = tt.offload(m, pool, optimizer=opt)
        if pinned:
            h.pin()
        losses = []
        for _ in range(3):
            loss = m(IDS, labels=IDS).loss
            loss.backward()
            h.step()
            losses.append(loss.item())
        h.unpin()
        assert all(v == 0 for v in pool.acq.values()), pool.acq
        return losses

    assert train(True) == train(False)


def test_a_model_larger_than_the_cap_is_not_pinned_and_stays_as_it_was(cpu):
    m = llama(True)
    pool = FakePool()
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    hooks = _hooked(m)
    pool.hbm_cap = h.bytes - pool.chunk_size
    with pytest.raises(tiermem.InvalidArgumentError, match="Offload.pin: the model takes .* more than the Pool's HBM cap"):
        h.pin()
    assert not h.pinned and _hooked(m) == hooks and all(v == 0 for v in pool.acq.values())
    pool.hbm_cap = h.bytes

    def full(buffers, stream=0, write=False):  # memory the engine cannot free now
        raise tiermem.OutOfMemoryError("acquire: no HBM can be freed")

    pool.acquire = full
    with pytest.raises(tiermem.OutOfMemoryError, match="Offload.pin: acquire: no HBM can be freed"):
        h.pin()
    assert not h.pinned and _hooked(m) == hooks and all(v == 0 for v in pool.acq.values())
    del pool.acquire
    h.remove()
    with pytest.raises(tiermem.InvalidArgumentError, match="Offload.pin: this Offload was removed"):
        h.pin()
