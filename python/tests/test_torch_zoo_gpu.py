"""The model families of test_torch_zoo.py on the GPU, through a real Pool whose HBM cap is a
fraction of each model, so that its modules stream in and out every pass (each module's tensors
take whole 2 MiB chunks): inference is bitwise the resident model's pass after pass, greedy
generation gives its tokens, and three AdamW steps with the weights, gradients, moments and
activations in tiermem give its losses. Needs a GPU (TIERMEM_TEST_BACKEND=cuda)."""

import os

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402
from test_torch_zoo import FAMILIES, _make  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TIERMEM_TEST_BACKEND") != "cuda", reason="needs a GPU (TIERMEM_TEST_BACKEND=cuda)"
)
MIB = 1 << 20


@pytest.fixture
def chunked(monkeypatch):
    """Every module's tensors in whole chunks of their own (none packed with others' or merged),
    fused experts cut apart however small: tiny models larger than the caps below."""
    monkeypatch.setattr(tiermem.units, "SMALL", 0)
    monkeypatch.setattr(tiermem.units, "MERGED", 0)
    monkeypatch.setattr(tiermem.units, "WASTE", 0)


def _inputs(family: str):
    ids = torch.randint(0, 512, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    extra = dict(decoder_input_ids=ids[:, :4]) if family == "t5" else {}
    return ids, extra


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_of_another_family_streamed_through_hbm_gives_the_resident_models_outputs(chunked, family):
    reference, model = _make(family).cuda(), _make(family).cuda()
    pool = tiermem.Pool(backend="cuda", hbm_limit=4 * MIB, host_limit="1GiB", chunk="2MiB")
    handle = tt.offload(model, pool, prefetch_bytes=2 * MIB)
    assert handle.bytes > pool.hbm_cap, f"{family}: {handle.bytes} bytes in tiermem, cap {pool.hbm_cap}"
    ids, extra = _inputs(family)
    with torch.no_grad():
        expected = reference(ids, **extra).logits
        for _ in range(3):  # the first pass records the schedule; the later ones page ahead along it
            assert torch.equal(model(ids, **extra).logits, expected)
        if family != "bert":
            greedy = dict(max_new_tokens=4, do_sample=False)
            assert torch.equal(model.generate(ids, **extra, **greedy), reference.generate(ids, **extra, **greedy))
    transfers = pool.stats()["transfers"]
    assert transfers["page_ins"] > 0, f"{family}: the model streamed ({transfers})"
    handle.remove("cuda")
    with torch.no_grad():
        assert torch.equal(model(ids, **extra).logits, expected)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_of_another_family_trains_with_its_state_and_activations_in_tiermem(chunked, family):
    """Eval mode (no dropout); the losses match to rounding (cuBLAS may pick other kernels for
    other addresses), and the offloaded model learns as the resident one does."""
    ids, extra = _inputs(family)
    labels = ids[:, :4].contiguous() if family == "t5" else ids

    def train(offload: bool) -> list[float]:
        model = _make(family).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        pool = handle = None
        if offload:
            # The weights, gradients and moments take a chunk per module; with every activation
            # of 4 KiB and up a buffer of its own, a step holds several times this cap.
            pool = tiermem.Pool(backend="cuda", hbm_limit=16 * MIB, host_limit="1GiB", chunk="2MiB")
            handle = tt.offload(model, pool, prefetch_bytes=2 * MIB, optimizer=optimizer)
        losses = []
        for _ in range(3):
            with tt.offload_activations(pool, min_bytes=4 << 10) if offload else torch.enable_grad():
                loss = model(ids, **extra, labels=labels).loss
            loss.backward()
            if offload:
                handle.step()
            else:
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)
            losses.append(loss.item())
        if offload:
            assert pool.stats()["transfers"]["page_ins"] > 0, f"{family}: the training state streamed"
        return losses

    expected, got = train(False), train(True)
    assert got == pytest.approx(expected, rel=1e-3), (family, got, expected)
    assert got[-1] < got[0], f"{family}: the model learns ({got})"
