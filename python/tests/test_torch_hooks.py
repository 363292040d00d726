"""How tiermem.torch hooks a model's modules (CPU, test_torch_cpu.py's stand-in Pool): each
site's forward is wrapped (PyTorch's module hooks cost a slow call path), the wrapper keeps the
forward's signature, releases what it acquired when the forward raises, and remove() gives
every module its own forward back — or, where something wrapped it since, calls through."""

import inspect

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem.torch as tt  # noqa: E402
from test_torch_cpu import IDS, FakePool, cpu, llama  # noqa: E402, F401  (cpu: a fixture)


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
