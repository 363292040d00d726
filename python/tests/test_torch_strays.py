"""A module that uses another module's tensors without calling it (``F.linear(x,
self.proj.weight)``) reads them acquired (tiermem.strays, CPU with test_torch_cpu.py's strict
stand-in Pool, where memory not acquired reads as garbage): the first pass finds such uses and
the using module's site adopts the tensors, so every later pass, and backward, acquires them."""

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
import tiermem.torch as tt  # noqa: E402
from test_torch_cpu import FakePool, cpu, packing  # noqa: E402, F401  (fixtures)
from test_torch_training_state import train  # noqa: E402

F = torch.nn.functional


class Block(torch.nn.Module):
    """Owns a scale of its own (so it is a site) and uses its child ``proj`` through F.linear."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((16,), 0.5))
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return F.linear(x * self.scale, self.proj.weight, self.proj.bias)


class Net(torch.nn.Module):
    """Owns nothing (no site of its own) and uses ``head``'s weight directly."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.block = Block()
        self.head = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x):
        return F.linear(torch.relu(self.block(self.a(x))), self.head.weight)


def _net():
    torch.manual_seed(0)
    return Net()


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


def test_tensors_used_without_their_module_are_acquired_pass_after_pass(cpu, packing):
    reference, model = _net(), _net()
    handle = tt.offload(model, FakePool(strict=True), prefetch_bytes=1 << 20)
    with torch.no_grad():
        expected = reference(X)
        for _ in range(3):
            assert torch.equal(model(X), expected)
    assert {tensor for _, tensor in handle.strays} <= {"block.proj.weight", "block.proj.bias", "head.weight"}
    assert any(site == "(model)" for site, _ in handle.strays), handle.strays


@pytest.mark.parametrize("pinned_between", [False, True])
def test_tensors_used_without_their_module_train_as_resident(cpu, packing, pinned_between):
    """Also across a pin and an unpin after the first step (the hooks are installed again)."""

    def pin_and_unpin(handle, step):
        if pinned_between and step == 1:
            handle.pin()
            handle.unpin()

    square = lambda model, x: model(x).square().mean()  # noqa: E731
    resident, offloaded = _net(), _net()
    expected = train(resident, False, X, square, steps=4, lr=1e-2)
    got = train(offloaded, True, X, square, steps=4, lr=1e-2, before=pin_and_unpin)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)), (got, expected)
    assert all(torch.equal(a, b) for a, b in zip(offloaded.parameters(), resident.parameters()))
