"""tiermem.torch: offloaded inference is bitwise the model in HBM, training gives the same
losses, errors leave the model unchanged. Needs PyTorch; all but the error tests need a GPU
(TIERMEM_TEST_BACKEND=cuda), and skip with that reason elsewhere."""

import gc
import os

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402

GPU = os.environ.get("TIERMEM_TEST_BACKEND") == "cuda"
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a GPU (TIERMEM_TEST_BACKEND=cuda)")
MIB = 1 << 20


def tiny_llama(seed: int = 0, layers: int = 6, dtype=torch.bfloat16):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    return model.eval()


def model_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


@needs_gpu
def test_offloaded_inference_is_bitwise_the_resident_model_and_streams_only_the_excess():
    reference = tiny_llama()
    offloaded = tiny_llama()
    pool = tiermem.Pool(backend="cuda", hbm_limit=16 * MIB, host_limit="1GiB")
    handle = tt.offload(offloaded, pool, prefetch_bytes=4 * MIB)
    size = handle.bytes  # every module's tensors take whole 2 MiB chunks
    assert size > 2 * pool.hbm_cap, f"the model ({size} bytes in tiermem) must be at least twice the cap"
    assert all(isinstance(p, torch.nn.Parameter) for p in offloaded.parameters())
    ids = torch.randint(0, 512, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
        for _ in range(3):  # the first pass records the schedule; the later ones use it
            got = offloaded(ids).logits
            assert torch.equal(got, expected)
        moved_before = pool.stats()["transfers"]["bytes_in"]
        offloaded(ids)
        moved = pool.stats()["transfers"]["bytes_in"] - moved_before
        tokens_ref = reference.generate(ids, max_new_tokens=8, do_sample=False)
        tokens = offloaded.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(tokens, tokens_ref)
    assert handle.schedule_length > 0
    # Belady keeps what fits: a pass moves about (model - cap), far less than the model.
    assert moved < size - pool.hbm_cap // 2, f"{moved} bytes moved per pass for a {size}-byte model"
    assert pool.stats()["transfers"]["prefetched"] > 0

    handle.remove(device="cuda")  # back to ordinary tensors: same outputs, nothing left in the pool
    with torch.no_grad():
        assert torch.equal(offloaded(ids).logits, expected)
    gc.collect()
    assert pool.stats()["buffers"] == []
    tt.offload(offloaded, pool).remove()

@needs_gpu
def test_training_with_params_grads_adam_and_activations_in_tiermem_gives_the_same_losses():
    def train(model, steps, offload):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        pool = handle = None
        if offload:
            pool = tiermem.Pool(backend="cuda", hbm_limit=24 * MIB, host_limit="1GiB")
            handle = tt.offload(model, pool, prefetch_bytes=4 * MIB, optimizer=opt)
        gen = torch.Generator("cuda").manual_seed(3)
        ids = torch.randint(0, 512, (4, 64), device="cuda", generator=gen)  # one batch: it is learned
        losses = []
        for _ in range(steps):
            ctx = tt.offload_activations(pool) if offload else torch.enable_grad()
            with ctx:
                loss = model(ids, labels=ids).loss
            loss.backward()
            if offload:
                handle.step()
            else:
                opt.step()
                opt.zero_grad(set_to_none=False)
            losses.append(loss.item())
        return losses

    expected = train(tiny_llama(dtype=torch.float32).train(), 5, offload=False)
    got = train(tiny_llama(dtype=torch.float32).train(), 5, offload=True)
    print("losses", got, "resident", expected)
    assert got == pytest.approx(expected, rel=1e-2), (got, expected)
    assert got[-1] < got[0], "the model learns"


@needs_gpu
def test_the_pluggable_allocator_serves_pytorch_from_the_pool():
    pool = tiermem.Pool(backend="cuda", hbm_limit="256MiB")
    mem = torch.cuda.MemPool(tt.allocator(pool).allocator())
    with torch.cuda.use_mem_pool(mem):
        x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        y = (x * 2).sum()
    assert y.item() == float((1 << 20) * ((1 << 20) - 1))
    assert tiermem._tiermem.allocator_live() > 0
    assert any(b["name"] == "torch" for b in pool.stats()["buffers"])
    assert tt.allocator_error() is None


@needs_gpu
def test_bad_models_are_refused_and_left_unchanged():
    pool = tiermem.Pool(backend="cuda", hbm_limit=64 * MIB)
    model = tiny_llama(layers=2)
    before = {n: p.data_ptr() for n, p in model.named_parameters()}

    strided = tiny_llama(layers=2)
    strided.lm_head.weight.data = strided.lm_head.weight.data.t().contiguous().t()
    with pytest.raises(tiermem.InvalidArgumentError, match="not contiguous"):
        tt.offload(strided, pool)
    with pytest.raises(tiermem.InvalidArgumentError, match="sparse"):
        _sparse_case(pool)
    tied = tiny_llama(layers=2)
    tied.lm_head.weight = tied.model.embed_tokens.weight
    with pytest.raises(tiermem.InvalidArgumentError, match="tied"):
        tt.offload(tied, pool)
    with pytest.raises(tiermem.InvalidArgumentError, match="optimizer"):
        tt.offload(model, pool, optimizer=torch.optim.SGD(model.parameters(), lr=1))
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert pool.stats()["buffers"] == [], "nothing was allocated"

    tt.offload(model, pool)
    with pytest.raises(tiermem.InvalidArgumentError, match="already offloaded"):
        tt.offload(model, pool)


def _sparse_case(pool):
    class Sparse(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.eye(4).to_sparse().cuda())

    tt.offload(Sparse(), pool)


def test_without_a_gpu_offload_is_a_clear_error():
    pool = tiermem.Pool(backend="sim", hbm_limit=8 * MIB)
    model = torch.nn.Linear(4, 4)
    weight = model.weight.data_ptr()
    with pytest.raises(tiermem.TiermemError, match="offload: needs a GPU"):
        tt.offload(model, pool)
    assert model.weight.data_ptr() == weight
    with pytest.raises(tiermem.InvalidArgumentError, match="tiermem.Pool"):
        tt.offload(model, "not a pool")
