"""Training through tiermem.torch reads and writes more than a module's trainable weights
(CPU, test_torch_cpu.py's strict stand-in Pool: memory not acquired reads as garbage, and what
is written under an acquisition that did not ask to write is lost, as the engine may drop it):

* backward reads tensors that have no gradient — a frozen layer's weight, to pass the
  gradient on to its input (partial fine-tuning), or a buffer whose view an embedding saved
  as its indices (BERT's ``position_ids``) — so a site holding such tensors is acquired in
  backward until its input's gradient is complete (found on the H200 as an illegal memory
  access training BERT with its small modules in buffers of their own);
* a module in training mode writes its buffers in forward (BatchNorm's running statistics),
  so such a site acquires them for writing: before, the statistics were dropped."""

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem.torch as tt  # noqa: E402
from test_torch_cpu import IDS, FakePool, cpu, llama, packing  # noqa: E402, F401  (fixtures)
from test_torch_zoo import _make  # noqa: E402


def train(model, offload: bool, batch, loss_of, steps: int = 3, lr: float = 1e-3, before=None) -> list[torch.Tensor]:
    """``steps`` AdamW steps of ``model`` on ``batch``, resident or offloaded into a strict
    stand-in Pool (removed after: the model is an ordinary one again); the losses.
    ``before(handle, step)`` runs before each offloaded step."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    handle = tt.offload(model, FakePool(strict=True), prefetch_bytes=1 << 20, optimizer=optimizer) if offload else None
    losses = []
    for step in range(steps):
        if handle is not None and before is not None:
            before(handle, step)
        loss = loss_of(model, batch)
        loss.backward()
        if offload:
            handle.step()
        else:
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.detach())
    if handle is not None:
        handle.remove()
    return losses


def _frozen_llama():
    model = llama(False, layers=3)
    for name, p in model.named_parameters():
        if ".layers.1." in name:  # a frozen layer between trainable ones: backward goes through it
            p.requires_grad_(False)
    return model


def test_a_frozen_layer_between_trainable_ones_is_read_in_backward(cpu, packing):
    causal = lambda model, ids: model(ids, labels=ids).loss  # noqa: E731
    expected = train(_frozen_llama(), False, IDS, causal)
    got = train(_frozen_llama(), True, IDS, causal)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)), (got, expected)


def test_a_frozen_layer_is_released_once_backward_has_passed_it(cpu):
    """Not held to the end of backward: a frozen model larger than HBM can still train."""
    model = _frozen_llama()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    handle = tt.offload(model, FakePool(strict=True), prefetch_bytes=1 << 20, optimizer=optimizer)
    frozen = [s for s in handle.sites if s.name.startswith("model.layers.1")]
    held_then = []
    def watch(module, args):  # the first layer's input gradient: backward has passed layer 1
        args[0].register_hook(lambda grad: held_then.append([len(s.held) for s in frozen]))

    model.model.layers[0].register_forward_pre_hook(watch)
    model(IDS, labels=IDS).loss.backward()
    assert frozen and held_then == [[0] * len(frozen)], held_then
    handle.step()


def test_an_embeddings_index_buffer_is_read_in_backward(cpu, packing):
    masked = lambda model, ids: model(ids, labels=ids).loss  # noqa: E731
    expected = train(_make("bert"), False, IDS, masked)
    got = train(_make("bert"), True, IDS, masked)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)), (got, expected)


def _cnn():
    torch.manual_seed(0)
    conv = lambda cin: (torch.nn.Conv2d(cin, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())  # noqa: E731
    return torch.nn.Sequential(*conv(3), *conv(8), torch.nn.Flatten(), torch.nn.Linear(8 * 12 * 12, 10))


def test_batchnorm_statistics_written_in_forward_are_kept(cpu, packing):
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(4, 3, 16, 16, generator=generator), torch.randint(0, 10, (4,), generator=generator))
    classify = lambda model, b: torch.nn.functional.cross_entropy(model(b[0]), b[1])  # noqa: E731
    resident, offloaded = _cnn(), _cnn()
    expected = train(resident, False, batch, classify)
    got = train(offloaded, True, batch, classify)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)), (got, expected)
    for mine, theirs in zip(offloaded.buffers(), resident.buffers()):  # running mean, variance, count
        assert torch.equal(mine, theirs), (mine, theirs)
    with torch.no_grad():
        assert torch.equal(offloaded.eval()(batch[0]), resident.eval()(batch[0]))


def test_a_module_writing_its_buffers_is_one_step_in_training_and_in_evaluation(cpu):
    """Acquired for writing in training mode only, but named alike: passes that alternate
    between the modes follow one recorded schedule."""
    model = _cnn()
    handle = tt.offload(model, FakePool(strict=True), prefetch_bytes=1 << 20)
    with torch.no_grad():
        model(torch.zeros(2, 3, 16, 16))
        steps = dict(handle._named)
        model.eval()(torch.zeros(2, 3, 16, 16))
    assert handle._named == steps
