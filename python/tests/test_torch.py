"""tiermem.torch: offloaded inference is bitwise the model in HBM, training gives the same
losses, errors leave the model unchanged. Needs PyTorch; all but the error tests need a GPU
(TIERMEM_TEST_BACKEND=cuda), and skip with that reason elsewhere."""

import gc
import os

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402

GPU = os.environ.get("TIERMEM_TEST_BACKEND") == "cuda"
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a GPU (TIERMEM_TEST_BACKEND=cuda)")
MIB = 1 << 20


def tiny_llama(seed: int = 0, layers: int = 6, dtype=torch.bfloat16, tied: bool = False, device: str = "cuda"):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    return model.eval()


def tiny_mixtral(seed: int = 0, device: str = "cuda"):
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.MixtralForCausalLM(config).to(torch.bfloat16)
    return model.eval()


def model_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


@needs_gpu
def test_offloaded_inference_is_bitwise_the_resident_model_and_streams_only_the_excess(monkeypatch):
    reference = tiny_llama()
    offloaded = tiny_llama()
    # Every module's tensors take whole 2 MiB chunks (no runs): a tiny model larger than the cap.
    monkeypatch.setattr(tiermem.units, "MERGED", 0)
    pool = tiermem.Pool(backend="cuda", hbm_limit=16 * MIB, host_limit="1GiB", chunk="2MiB")
    handle = tt.offload(offloaded, pool, prefetch_bytes=4 * MIB)
    size = handle.bytes
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
def test_the_state_dict_of_a_model_larger_than_the_cap_is_the_resident_models(monkeypatch, tmp_path):
    """Most of the model is out of HBM after a pass: state_dict (and save_pretrained) reads
    every tensor with its buffer acquired, so they give the resident model's bytes; and
    load_state_dict writes them so."""
    monkeypatch.setattr(tiermem.units, "MERGED", 0)
    reference, offloaded = tiny_llama(tied=True), tiny_llama(tied=True)
    pool = tiermem.Pool(backend="cuda", hbm_limit=16 * MIB, host_limit="1GiB", chunk="2MiB")
    handle = tt.offload(offloaded, pool, prefetch_bytes=4 * MIB)
    assert handle.bytes > 2 * pool.hbm_cap
    ids = torch.randint(0, 512, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    with torch.no_grad():
        for _ in range(2):
            offloaded(ids)
    expected, got = reference.state_dict(), offloaded.state_dict()
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], expected[k].cpu()) for k in expected)
    # Saved and loaded back as the resident model is (loading recomputes non-persistent
    # buffers such as the rotary frequencies in float32: compare like with like).
    from tiermem import loading

    loaded = []
    for model, directory in ((offloaded, tmp_path / "offloaded"), (reference, tmp_path / "resident")):
        model.save_pretrained(directory)
        loaded.append(type(reference).from_pretrained(directory, **loading.dtype_kwargs(torch.bfloat16)).to("cuda").eval())
    with torch.no_grad():
        assert torch.equal(loaded[0](ids).logits, loaded[1](ids).logits)
    # And back: another model's weights loaded into the offloaded one, module by module.
    other = tiny_llama(seed=9, tied=True)
    offloaded.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert torch.equal(offloaded(ids).logits, other(ids).logits)
    handle.remove(device="cuda")


@needs_gpu
def test_two_models_streaming_in_turns_in_one_pool_each_page_ahead_along_their_own_order(monkeypatch):
    """Two models, each larger than the Pool's cap, run passes in turns: each records a
    schedule of its own (the engine keeps both), so each pass pages ahead; outputs bitwise.
    Removing one keeps the other's schedule."""
    monkeypatch.setattr(tiermem.units, "MERGED", 0)
    refs = [tiny_llama(seed) for seed in (1, 2)]
    models = [tiny_llama(seed) for seed in (1, 2)]
    pool = tiermem.Pool(backend="cuda", hbm_limit=16 * MIB, host_limit="1GiB", chunk="2MiB")
    handles = [tt.offload(m, pool, prefetch_bytes=4 * MIB) for m in models]
    assert all(h.bytes > pool.hbm_cap for h in handles)
    ids = torch.randint(0, 512, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    with torch.no_grad():
        expected = [r(ids).logits for r in refs]
        for turn in range(8):
            which = turn % 2
            before = pool.stats()["transfers"]["prefetched"]
            assert torch.equal(models[which](ids).logits, expected[which])
            if turn >= 4:  # both recorded (turns 0 and 1), both in use once since
                assert pool.stats()["transfers"]["prefetched"] > before, f"model {which} paged nothing ahead"
    schedules = [h.schedule for h in handles]
    assert all(schedules) and not {id(k) for k, _ in schedules[0]} & {id(k) for k, _ in schedules[1]}
    handles[0].remove(device="cuda")  # forgets its own schedule only: the other pages ahead at once
    assert handles[1].schedule == schedules[1]
    with torch.no_grad():
        before = pool.stats()["transfers"]["prefetched"]
        assert torch.equal(models[1](ids).logits, expected[1])
        assert pool.stats()["transfers"]["prefetched"] > before
        assert torch.equal(models[0](ids).logits, expected[0])  # removed: an ordinary model
    handles[1].remove(device="cuda")


def _trainer(model, offload: bool):
    """AdamW over ``model``: offloaded into a 24 MiB Pool with its activations of 64 KiB and up
    (the tiny models' are all under offload_activations' default 1 MiB), or resident. Returns
    ``(step, pool, opt)``: ``step(ids, backward_twice=False)`` trains on ``ids`` and returns the
    loss (twice: a graph kept for a second backward)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    pool = handle = None
    if offload:
        pool = tiermem.Pool(backend="cuda", hbm_limit=24 * MIB, host_limit="1GiB")
        handle = tt.offload(model, pool, prefetch_bytes=4 * MIB, optimizer=opt)

    def step(ids, backward_twice: bool = False) -> float:
        with tt.offload_activations(pool, min_bytes=64 << 10) if offload else torch.enable_grad():
            loss = model(ids, labels=ids).loss
        loss.backward(retain_graph=backward_twice)
        if backward_twice:
            loss.backward()  # the kept graph's activations are still there
        if offload:
            handle.step()
        else:
            opt.step()
            opt.zero_grad(set_to_none=False)
        return loss.item()

    return step, pool, opt


@needs_gpu
def test_training_with_params_grads_adam_and_activations_in_tiermem_gives_the_same_losses():
    def train(offload):
        step, _, _ = _trainer(tiny_llama(dtype=torch.float32).train(), offload)
        ids = torch.randint(0, 512, (4, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
        return [step(ids) for _ in range(5)]  # one batch: it is learned

    expected, got = train(False), train(True)
    print("losses", got, "resident", expected)
    assert got == pytest.approx(expected, rel=1e-2), (got, expected)
    assert got[-1] < got[0], "the model learns"


@needs_gpu
@pytest.mark.parametrize("reentrant", [False, True])
def test_training_with_gradient_checkpointing_gives_the_same_losses(reentrant):
    """Layers recomputed in backward (transformers' gradient checkpointing, either kind of
    torch.utils.checkpoint) enter their steps again and save their activations again, inside
    backward: the losses are the resident model's."""

    def train(offload):
        model = tiny_llama(dtype=torch.float32).train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        step, _, _ = _trainer(model, offload)
        ids = torch.randint(0, 512, (4, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(7))
        return [step(ids) for _ in range(4)]

    expected, got = train(False), train(True)
    print("losses", got, "resident", expected)
    assert got == pytest.approx(expected, rel=1e-2), (got, expected)


@needs_gpu
def test_activation_buffers_are_reused_every_step_whatever_the_batch_and_a_kept_graph_keeps_its_own():
    """Saved tensors reuse the buffers of the same place in the last step (their dead bytes
    discarded, not copied), a batch of another shape takes buffers of its own and those left
    unused for a whole pass are freed, and a graph kept for a second backward keeps its
    activations: the losses are the resident model's throughout."""
    lengths = [64, 64, 64, 48, 48, 64, 64]

    def train(offload):
        step, pool, _ = _trainer(tiny_llama(dtype=torch.float32).train(), offload)
        gen = torch.Generator("cuda").manual_seed(5)
        losses, counts = [], []
        for i, length in enumerate(lengths):
            losses.append(step(torch.randint(0, 512, (4, length), device="cuda", generator=gen), backward_twice=i == 2))
            if offload:
                counts.append(sum(b["name"] == "activation" for b in pool.stats()["buffers"]))
        return losses, counts, pool

    expected, _, _ = train(False)
    got, counts, pool = train(True)
    print("losses", got, "resident", expected, "activation buffers", counts)
    assert got == pytest.approx(expected, rel=1e-2), (got, expected)
    assert counts[1] == counts[0] > 0, "the second step reuses the first one's buffers"
    assert pool.stats()["transfers"]["discarded"] > 0
    assert counts[-1] <= counts[0] + counts[3], "buffers unused for a pass are freed"


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


def _ids(batch=2, length=32, seed=1):
    return torch.randint(0, 512, (batch, length), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))


def _same_outputs(reference, offloaded, passes=3):
    """Logits of several passes (the first records the schedule) and greedy tokens equal."""
    ids = _ids()
    with torch.no_grad():
        expected = reference(ids).logits
        for _ in range(passes):
            assert torch.equal(offloaded(ids).logits, expected)
        tokens = offloaded.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(tokens, reference.generate(ids, max_new_tokens=8, do_sample=False))
    return expected


@needs_gpu
def test_tied_weights_live_once_are_acquired_by_both_users_and_stay_tied_after_remove(monkeypatch):
    reference, model = tiny_llama(tied=True), tiny_llama(tied=True)
    monkeypatch.setattr(tiermem.units, "MERGED", 0)  # whole 2 MiB chunks a module: larger than the cap
    pool = tiermem.Pool(backend="cuda", hbm_limit=12 * MIB, host_limit="1GiB", chunk="2MiB")
    handle = tt.offload(model, pool, prefetch_bytes=4 * MIB)
    assert handle.bytes > 2 * pool.hbm_cap
    shared = [u for u in handle.units if u.name.startswith("shared:")]
    assert [u.tensors[0].names for u in shared] == [["model.embed_tokens.weight", "lm_head.weight"]]
    users = [s.name for s in handle.sites if shared[0] in s.units]
    assert users == ["model.embed_tokens", "lm_head"]
    assert model.lm_head.weight is model.model.embed_tokens.weight
    expected = _same_outputs(reference, model)
    steps = [key.name for key, phase in handle.schedule]
    assert "model.embed_tokens" in steps and "lm_head" in steps, "the schedule knows both uses"
    handle.remove(device="cuda")
    assert model.lm_head.weight is model.model.embed_tokens.weight, "remove() keeps the tie"
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, expected)


@needs_gpu
def test_training_a_tied_model_keeps_one_gradient_and_one_pair_of_moments_per_tensor():
    def train(offload):
        model = tiny_llama(dtype=torch.float32, layers=2, tied=True).train()
        step, _, opt = _trainer(model, offload)
        ids = torch.randint(0, 512, (4, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
        losses = [step(ids) for _ in range(4)]
        assert len(opt.state) == len(list(model.parameters())), "one state per distinct tensor"
        assert model.lm_head.weight is model.model.embed_tokens.weight
        return losses

    expected, got = train(False), train(True)
    assert got == pytest.approx(expected, rel=1e-2), (got, expected)


@needs_gpu
def test_a_mixture_of_experts_model_is_bitwise_the_resident_one_with_the_same_schedule_every_pass():
    reference, model = tiny_mixtral(), tiny_mixtral()
    pool = tiermem.Pool(backend="cuda", hbm_limit=16 * MIB, host_limit="1GiB")
    handle = tt.offload(model, pool, prefetch_bytes=4 * MIB)
    assert handle.bytes > 1.5 * pool.hbm_cap
    moe = [s for s in handle.sites if s.name.endswith(".mlp") or s.name.endswith("block_sparse_moe")]
    assert len(moe) == 4, [s.name for s in handle.sites]
    assert not any("experts." in s.name for s in handle.sites), "no hooks on single experts"
    _same_outputs(reference, model)
    length = handle.schedule_length
    with torch.no_grad():
        model(_ids(seed=5))
        model(_ids(seed=6))
    assert handle.schedule_length == length


@needs_gpu
@pytest.mark.parametrize("implementation", ["eager", "grouped_mm"])
def test_fused_experts_cut_by_expert_are_bitwise_the_resident_model(monkeypatch, implementation):
    """Each expert a part of one reservation (tiermem.units: fused experts cut by expert) on the
    real engine: the fused tensors are strided views over the parts, the forward acquires
    experts as it uses them (eager's loop one at a time, grouped_mm's kernel all), and the
    outputs are bitwise the resident model's, pass after pass, with the schedule recorded once."""
    import tiermem.units
    from tiermem import experts as experts_module

    monkeypatch.setattr(tiermem.units, "WASTE", 0)
    reference, model = tiny_mixtral(), tiny_mixtral()
    for m in (reference, model):
        m.config._experts_implementation = "eager"  # cut; grouped_mm is switched to after
    pool = tiermem.Pool(backend="cuda", hbm_limit=40 * MIB, host_limit="1GiB")
    handle = tt.offload(model, pool, prefetch_bytes=4 * MIB)
    for m in (reference, model):
        m.config._experts_implementation = implementation
    assert handle.bytes > 1.5 * pool.hbm_cap
    blocks = [s for s in handle.sites if s.experts]
    assert len(blocks) == 4 and all(e.count == 8 for s in blocks for e in s.experts)
    parts = [u.parts["weights"] for u in blocks[0].experts[0].units]
    assert all(b.ptr - a.ptr == pool.chunk_size for a, b in zip(parts, parts[1:])), "parts side by side"
    assert isinstance(model.model.layers[0].mlp.experts.gate_up_proj, experts_module.ExpertWeights)
    _same_outputs(reference, model)
    length = handle.schedule_length
    with torch.no_grad():
        model(_ids(seed=5))
        model(_ids(batch=1, length=1, seed=6))  # one token: most experts skipped
        assert torch.equal(model(_ids(seed=7)).logits, reference(_ids(seed=7)).logits)
    assert handle.schedule_length == length
    handle.sleep(release_hbm=False)  # pages every part out: refused if one were still acquired
    handle.wake()
    handle.remove("cuda")
    assert type(model.model.layers[0].mlp.experts.gate_up_proj) is torch.nn.Parameter
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, reference(_ids()).logits)


def _tiny_offloaded():
    """A tiny Llama offloaded into a Pool of 64 MiB, and the logits it must give."""
    reference, model = tiny_llama(), tiny_llama()
    pool = tiermem.Pool(backend="cuda", hbm_limit=64 * MIB, host_limit="1GiB")
    handle = tt.offload(model, pool, prefetch_bytes=4 * MIB)
    return model, pool, handle, _same_outputs(reference, model, passes=2)


@needs_gpu
def test_sleep_gives_hbm_back_and_wake_brings_the_model_back_bitwise():
    model, pool, handle, expected = _tiny_offloaded()
    given_back = handle.sleep()
    assert given_back > 0
    assert all(b["in_hbm"] == 0 for b in pool.stats()["buffers"])
    assert pool.stats()["hbm"]["used_bytes"] == 0
    waking = handle.wake(block=False)
    waking.wait()
    assert waking.done() and waking.bytes >= min(handle.bytes, pool.hbm_cap) // 2
    assert sum(b["in_hbm"] for b in pool.stats()["buffers"]) > 0
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, expected)
    handle.sleep(release_hbm=False)
    handle.wake()
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, expected)
    pool.close()
    with pytest.raises(tiermem.BufferStateError, match="Offload.wake: the model's Pool is closed"):
        handle.wake()
    with pytest.raises(tiermem.BufferStateError, match="Offload.sleep: the model's Pool is closed"):
        handle.sleep()


@needs_gpu
def test_a_pinned_model_is_all_in_hbm_held_and_gives_the_same_outputs():
    model, pool, handle, expected = _tiny_offloaded()
    handle.sleep(release_hbm=False)
    handle.pin()
    stats = pool.stats()
    assert all(b["in_hbm"] * stats["chunk_size"] >= b["size"] for b in stats["buffers"]), "every buffer resident"
    with pytest.raises(tiermem.BufferStateError, match="acquired"):
        pool.page_out()  # acquired memory never leaves
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, expected)
    handle.sleep()  # unpins, then pages out
    assert not handle.pinned and all(b["in_hbm"] == 0 for b in pool.stats()["buffers"])
    handle.pin()  # pages the model in again, held
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, expected)
    handle.unpin()
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, expected)
    handle.pin()
    pool.finish(pool.set_hbm_budget(handle.bytes // 2))  # the daemon takes HBM back
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, expected)
    assert not handle.pinned, "the pass began under a smaller budget: unpinned, streamed"
    handle.remove("cuda")


def test_units_share_tied_tensors_and_group_experts_without_a_gpu(monkeypatch):
    import tiermem.units
    from tiermem.units import plan

    monkeypatch.setattr(tiermem.units, "MERGED", 0)  # no runs: a block's experts in its own unit

    model = tiny_llama(layers=1, tied=True, device="cpu")
    units, sites = plan(model, small=0)  # no packing: see the next test
    shared = [u for u in units if len([s for s in sites if u in s.units]) > 1]
    assert [u.name for u in shared] == ["shared:model.embed_tokens.weight"]
    distinct = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    assert sorted(id(o.tensor) for u in units for o in u.tensors) == sorted(distinct), "every tensor once"
    units, sites = plan(tiny_mixtral(device="cpu"))
    moe = [s for s in sites if any("experts" in n for u in s.units for o in u.tensors for n in o.names)]
    assert len(moe) == 4 and all(len(s.units) == 1 for s in moe)


def test_small_units_are_packed_a_chunk_at_a_time_and_sites_still_use_only_their_own_tensors():
    """A 3B-sized Llama on the meta device: its norms (6 KB each) share one buffer, acquired by
    each norm; the projections keep theirs; every tensor is laid out once."""
    transformers = pytest.importorskip("transformers")
    from tiermem.units import PACK, SMALL, plan

    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=3072, intermediate_size=8192, num_hidden_layers=3,
                                   num_attention_heads=24, num_key_value_heads=8, tie_word_embeddings=True)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    units, sites = plan(model)
    packs = [u for u in units if u.name.startswith("pack:")]
    assert len(packs) == 1 and packs[0].weight_bytes <= PACK
    small = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.nbytes <= SMALL]
    assert sorted(n for o in packs[0].tensors for n in o.names) == sorted(small)
    assert len(small) == 9  # 7 norms' weights, the rotary embedding's two buffers
    assert all(u.weight_bytes > SMALL for u in units if u not in packs)
    norms = [s for s in sites if "norm" in s.name]
    assert len(norms) == 7 and all(s.units == packs and [o.name for o in s.uses] == [f"{s.name}.weight"] for s in norms)
    distinct = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    assert sorted(id(o.tensor) for u in units for o in u.tensors) == sorted(distinct), "every tensor once"
    few = plan(model, pack=4 << 10)[0]  # no room for a norm: nothing worth packing
    assert not [u for u in few if u.name.startswith("pack:")] and len(few) == len(units) - 1 + 8
