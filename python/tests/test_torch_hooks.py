"""How tiermem.torch hooks a model's modules (CPU, test_torch_cpu.py's stand-in Pool): each
site's forward is wrapped (PyTorch's module hooks cost a slow call path), the wrapper keeps the
forward's signature, releases what it acquired when the forward raises, and remove() gives
every module its own forward back — or, where something wrapped it since, calls through. And
the model's state_dict reads, and load_state_dict writes, each offloaded tensor with its buffer
acquired (tiermem.state)."""

import inspect

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402
from test_torch_cpu import IDS, FakePool, cpu, llama, mixtral  # noqa: E402, F401  (cpu: a fixture)


def test_sites_are_wrapped_not_hooked_and_remove_gives_their_forward_back(cpu):
    m = llama(True)
    signatures = {name: inspect.signature(module.forward) for name, module in m.named_modules()}
    h = tt.offload(m, FakePool(), prefetch_bytes=1 << 20)
    sites = [s.module for s in h.sites if s.module is not m]
    assert sites and all("forward" in module.__dict__ for module in sites)
    assert not any(module._forward_pre_hooks or module._forward_hooks for module in sites), "no module hooks"
    assert {name: inspect.signature(module.forward) for name, module in m.named_modules()} == signatures
    h.remove()
    assert not any("forward" in module.__dict__ for module in m.modules())
    assert not any(module._forward_pre_hooks or module._forward_hooks for module in m.modules())


def test_a_forward_that_raises_releases_what_it_acquired(cpu):
    m = llama(True)
    pool = FakePool()
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    target, linear = m.model.layers[0].mlp.down_proj.weight, torch.nn.functional.linear

    def failing(x, weight, bias=None):
        if weight is target:
            raise RuntimeError("boom")
        return linear(x, weight, bias)

    torch.nn.functional.linear = failing
    try:
        with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
            m(IDS)
    finally:
        torch.nn.functional.linear = linear
    assert all(v == 0 for v in pool.acq.values()), f"held after the error: {pool.acq}"
    assert all(not s.held for s in h.sites), "no site still holds"
    with torch.no_grad():
        m(IDS)  # and the model runs again
    assert all(v == 0 for v in pool.acq.values())


def test_a_forward_wrapped_after_offload_survives_remove(cpu):
    m = llama(True)
    pool = FakePool()
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    module = m.model.layers[0].mlp.up_proj
    ours, calls = module.forward, []

    def theirs(*args, **kwargs):
        calls.append(1)
        return ours(*args, **kwargs)

    module.forward = theirs
    h.remove()
    assert module.forward is theirs
    acquired = dict(pool.acq)
    with torch.no_grad():
        m(IDS)
    assert calls and pool.acq == acquired, "the wrapper left in place calls straight through"


@pytest.mark.parametrize("make", [lambda: llama(True), mixtral], ids=["tied", "moe"])
def test_state_dict_reads_every_tensor_acquired_and_save_pretrained_saves_the_model(cpu, monkeypatch, tmp_path, make):
    """The strict pool turns memory not acquired into NaN: an offloaded model's state_dict
    (and save_pretrained, which calls it) gives the resident model's tensors, in host memory,
    a tied tensor once under both names; keep_vars gives the parameters themselves."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)  # fused experts cut apart, however small
    ref, m = make(), make()
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    expected, got = ref.state_dict(), m.state_dict()
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], expected[k]) and got[k].device.type == "cpu" for k in expected)
    if m.config.tie_word_embeddings:
        assert got["lm_head.weight"] is got["model.embed_tokens.weight"]
    layer = m.model.layers[0].state_dict()
    assert all(torch.equal(t, ref.model.layers[0].state_dict()[k]) for k, t in layer.items())
    assert all(isinstance(t, torch.nn.Parameter) for k, t in m.state_dict(keep_vars=True).items() if k.endswith("weight"))
    assert all(v == 0 for v in pool.acq.values()), pool.acq
    m.save_pretrained(tmp_path)
    loaded = type(ref).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, ref(IDS).logits)
    h.remove()
    assert not any(mod._state_dict_hooks or mod._state_dict_pre_hooks for mod in m.modules())


@pytest.mark.parametrize("make", [lambda: llama(True), mixtral], ids=["tied", "moe"])
def test_load_state_dict_writes_every_tensor_acquired(cpu, monkeypatch, make):
    """Resuming from a checkpoint: load_state_dict into an offloaded model writes each module's
    tensors with its buffers acquired (the strict pool loses writes to memory not acquired),
    so the model then computes as the one the checkpoint came from."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)
    m, source = make(), make()
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(-1.5)  # other weights
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    result = m.load_state_dict(source.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        assert torch.equal(m(IDS).logits, source(IDS).logits)
    assert all(v == 0 for v in pool.acq.values()), pool.acq
    h.remove()
    assert not any("_load_from_state_dict" in mod.__dict__ for mod in m.modules())
    with torch.no_grad():
        assert torch.equal(m(IDS).logits, source(IDS).logits)
