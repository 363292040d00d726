"""tiermem.torch.from_pretrained / load_checkpoint: a checkpoint saved with save_pretrained
loads back into tiermem with the same logits as transformers' own loading; every bad input is
a tiermem error naming the tensor or file, leaving the model as it was. The checks of files
and of tensors against the model run without a GPU (PyTorch, transformers and safetensors
needed); loading for real needs one (TIERMEM_TEST_BACKEND=cuda)."""

import json
import os

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="loading tests build transformers models")
pytest.importorskip("safetensors", reason="checkpoints are safetensors files")
import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402
from tiermem import loading  # noqa: E402
from tiermem.units import plan  # noqa: E402

GPU = os.environ.get("TIERMEM_TEST_BACKEND") == "cuda"
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a GPU (TIERMEM_TEST_BACKEND=cuda)")
MIB = 1 << 20


def config(tied: bool = True, layers: int = 4):
    return transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )


def saved(path, tied=True, layers=4, shard=None, seed=0):
    """A random bf16 Llama saved with save_pretrained into ``path``."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config(tied, layers)).to(torch.bfloat16)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)
    return path


def meta_model(tied=True, layers=4):
    return loading.build_on_meta(saved_config_dir(tied, layers), dtype=torch.bfloat16)


_CONFIG_DIRS = {}


def saved_config_dir(tied, layers):
    import tempfile

    key = (tied, layers)
    if key not in _CONFIG_DIRS:
        d = tempfile.mkdtemp(prefix="tiermem-config-")
        config(tied, layers).save_pretrained(d)
        _CONFIG_DIRS[key] = d
    return _CONFIG_DIRS[key]


def check(path, model=None):
    model = model or meta_model()
    units, _ = plan(model)
    return loading.match("load_checkpoint", units, loading.Checkpoint(path))


def test_a_saved_tied_model_matches_its_meta_model_though_lm_head_is_not_in_the_file(tmp_path):
    path = saved(tmp_path / "m")
    checkpoint = loading.Checkpoint(path)
    assert "lm_head.weight" not in checkpoint.entries
    model = meta_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.is_meta
    units, _ = plan(model)
    sources = loading.match("load_checkpoint", units, checkpoint)
    kept = [o.name for u in units for o in u.tensors if sources[id(o)] is None]
    assert kept and all("rotary_emb" in k for k in kept), "only the real (non-persistent) buffers keep their values"


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path):
    path = saved(tmp_path / "m", shard="300KB")
    assert (path / loading.INDEX).exists()
    checkpoint = loading.Checkpoint(path)
    assert len(checkpoint.files) > 1
    check(path)
    check(path / loading.INDEX)


def test_missing_paths_and_truncated_or_missing_shards_are_errors_naming_the_file(tmp_path):
    with pytest.raises(tiermem.InvalidArgumentError, match="nowhere does not exist"):
        loading.Checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(tiermem.InvalidArgumentError, match="holds neither model.safetensors"):
        loading.Checkpoint(tmp_path / "empty")
    single = saved(tmp_path / "single")
    data = (single / "model.safetensors").read_bytes()
    (single / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(tiermem.InvalidArgumentError, match=r"model.safetensors is truncated"):
        loading.Checkpoint(single)
    sharded = saved(tmp_path / "sharded", shard="300KB")
    index = json.loads((sharded / loading.INDEX).read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (sharded / shard).unlink()
    with pytest.raises(tiermem.InvalidArgumentError, match=f"{shard} \\(a shard named by"):
        loading.Checkpoint(sharded)


def test_tensors_that_do_not_match_the_model_are_errors_naming_tensor_and_file(tmp_path):
    with pytest.raises(tiermem.InvalidArgumentError, match=r"model.layers.3.* in .*model.safetensors is unexpected"):
        check(saved(tmp_path / "long", layers=4), meta_model(layers=3))
    with pytest.raises(tiermem.InvalidArgumentError, match="lm_head.weight is missing from the checkpoint"):
        check(saved(tmp_path / "tied"), meta_model(tied=False))
    with pytest.raises(tiermem.InvalidArgumentError, match=r"model.layers.3.* is missing"):
        check(saved(tmp_path / "short", layers=3))
    wide = transformers.LlamaConfig(**{**config().to_dict(), "intermediate_size": 768})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(wide).to(torch.bfloat16).save_pretrained(tmp_path / "wide")
    with pytest.raises(tiermem.InvalidArgumentError, match=r"mlp.down_proj.weight in .* has shape \[256, 768\], the model's is \[256, 704\]"):
        check(tmp_path / "wide")
    from safetensors.torch import save_file

    model = meta_model(layers=1)
    ints = {n: torch.zeros(t.shape, dtype=torch.int32) for n, t in model.state_dict().items() if n != "lm_head.weight"}
    (tmp_path / "ints").mkdir()
    save_file(ints, str(tmp_path / "ints" / "model.safetensors"))
    with pytest.raises(tiermem.InvalidArgumentError, match="is I32, which the model's torch.bfloat16 does not accept"):
        check(tmp_path / "ints", model)


def test_from_pretrained_refuses_a_pool_without_a_gpu_and_a_dtype_the_model_cannot_take(tmp_path):
    path = saved(tmp_path / "m")
    with pytest.raises(tiermem.TiermemError, match="from_pretrained: needs a GPU"):
        tt.from_pretrained(path, tiermem.Pool(backend="sim", hbm_limit=8 * MIB))
    with pytest.raises(tiermem.InvalidArgumentError, match="dtype torch.int8 is not a floating-point"):
        loading.build_on_meta(path, dtype=torch.int8)


def test_staged_reads_put_every_byte_of_the_checkpoint_in_the_buffers(tmp_path):
    """The reading path without a GPU: pieces of a few tensors, rows of large ones, through
    staging areas, into buffers of a simulated pool."""
    path = saved(tmp_path / "m", shard="300KB")
    model = meta_model()
    units, _ = plan(model)
    sources = loading.match("load_checkpoint", units, loading.Checkpoint(path))
    pool = tiermem.Pool(backend="sim", hbm_limit=8 * MIB, host_limit="256MiB")
    layouts = [u.layout(False) for u in units]
    for unit, layout in zip(units, layouts):
        unit.parts["weights"] = pool.alloc(layout["weights"][1])
    pieces = loading.pieces(units, layouts, sources, 64 << 10)
    assert any(len(p.parts) > 1 for p in pieces) and any(p.parts[0][3] > 0 for p in pieces)
    loading._stream_in("load_checkpoint", pieces, quiet=True)
    from safetensors.torch import load_file

    files = loading.Checkpoint(path).files
    expected = {n: t for f in files for n, t in load_file(str(f)).items()}
    for unit, layout in zip(units, layouts):
        for _, owned, offset in layout["weights"][0]:
            if sources[id(owned)] is None:
                continue
            want = expected[sources[id(owned)].name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert unit.parts["weights"].read(len(want), offset) == want, owned.name


@needs_gpu
def test_from_pretrained_gives_the_logits_of_transformers_loading_under_a_small_cap(tmp_path, monkeypatch):
    path = saved(tmp_path / "m", shard="1MB", layers=6)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, **loading.dtype_kwargs(torch.bfloat16)).cuda().eval()
    monkeypatch.setattr(tiermem.units, "MERGED", 0)  # whole 2 MiB chunks a module: larger than the cap
    pool = tiermem.Pool(backend="cuda", hbm_limit=12 * MIB, host_limit="1GiB", chunk="2MiB")
    handle = tt.from_pretrained(path, pool, quiet=True, staging_bytes=1 * MIB)
    model = handle.model
    assert handle.bytes > 2 * pool.hbm_cap and handle.load_bytes > 0
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(p.is_cuda for p in model.parameters())
    ids = torch.randint(0, 512, (2, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
        for _ in range(3):
            assert torch.equal(model(ids).logits, expected)
    handle.remove(device="cuda")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)


@needs_gpu
def test_a_bad_checkpoint_leaves_the_meta_model_as_it_was_and_the_pool_empty(tmp_path):
    pool = tiermem.Pool(backend="cuda", hbm_limit=16 * MIB, host_limit="1GiB")
    model = meta_model(tied=False)
    before = {n: id(p) for n, p in model.named_parameters()}
    with pytest.raises(tiermem.InvalidArgumentError, match="lm_head.weight is missing"):
        tt.load_checkpoint(model, saved(tmp_path / "tied"), pool, quiet=True)
    assert {n: id(p) for n, p in model.named_parameters()} == before
    assert all(p.is_meta for p in model.parameters())
    assert pool.stats()["buffers"] == []
    assert not hasattr(model, "_tiermem_offload")
    handle = tt.load_checkpoint(model, saved(tmp_path / "untied", tied=False), pool, quiet=True)
    assert not any(p.is_meta for p in handle.model.parameters())


def saved_mixtral(path, shard="200KB", hidden=64, mlp=128, layers=2):
    """A random bf16 Mixtral-style model (4 experts) saved with save_pretrained: transformers
    stores its fused experts one expert and projection at a time (block_sparse_moe.experts.N.wK)."""
    cfg = transformers.MixtralConfig(vocab_size=512, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(3)
    transformers.MixtralForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path, max_shard_size=shard)
    return path


def test_experts_saved_one_by_one_fill_the_fused_experts_byte_for_byte(tmp_path):
    """transformers' conversion rules, applied to the names (tiermem.conversions): the fused
    up projection of each layer is made of every expert's w1 and w3, the down projection of
    their w2, each read straight into its place; the bytes are those transformers' own
    loading puts in the model."""
    from tiermem import conversions

    path = saved_mixtral(tmp_path / "moe")
    checkpoint = loading.Checkpoint(path)
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight" in checkpoint.entries
    model = loading.build_on_meta(path, dtype=torch.bfloat16)
    made, refused = conversions.converted(model, checkpoint.entries)
    assert not refused
    gate_up = made["model.layers.0.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (4, 256, 64) and gate_up.sources[:3] == [
        "model.layers.0.block_sparse_moe.experts.0.w1.weight",
        "model.layers.0.block_sparse_moe.experts.0.w3.weight",
        "model.layers.0.block_sparse_moe.experts.1.w1.weight",
    ]
    assert made["model.layers.0.mlp.gate.weight"].name == "model.layers.0.block_sparse_moe.gate.weight"
    units, _ = plan(model)
    sources = loading.match("from_pretrained", units, checkpoint, [], made, refused)
    pool = tiermem.Pool(backend="sim", hbm_limit=8 * MIB, host_limit="256MiB")
    layouts = [u.layout(False) for u in units]
    for unit, layout in zip(units, layouts):
        unit.parts["weights"] = pool.alloc(layout["weights"][1])
    loading._stream_in("from_pretrained", loading.pieces(units, layouts, sources, 16 << 10), quiet=True)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, **loading.dtype_kwargs(torch.bfloat16))
    expected = dict(reference.named_parameters())
    checked = 0
    for unit, layout in zip(units, layouts):
        for _, owned, offset in layout["weights"][0]:
            if owned.name in expected:
                want = expected[owned.name].detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                assert unit.parts["weights"].read(len(want), offset) == want, owned.name
                checked += 1
    assert checked == len(expected)


def test_a_converted_tensor_that_cannot_be_made_is_an_error_naming_it(tmp_path):
    from tiermem import conversions

    path = saved_mixtral(tmp_path / "moe")
    checkpoint = loading.Checkpoint(path)
    del checkpoint.entries["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    model = loading.build_on_meta(path, dtype=torch.bfloat16)
    made, refused = conversions.converted(model, checkpoint.entries)
    assert "expert 2 projection 1" in refused["model.layers.1.mlp.experts.gate_up_proj"]
    units, _ = plan(model)
    with pytest.raises(tiermem.InvalidArgumentError, match=r"model\.layers\.1\.mlp\.experts\.gate_up_proj cannot be read .*expert 2 projection 1.*tiermem\.torch\.offload"):
        loading.match("from_pretrained", units, checkpoint, [], made, refused)


@needs_gpu
def test_from_pretrained_reads_a_mixtral_checkpoint_as_transformers_does(tmp_path):
    # Fused experts of whole chunks (up 4 MiB, down 2 MiB a layer): cut by tensor, 30 MiB in all.
    path = saved_mixtral(tmp_path / "moe", shard="4MB", hidden=256, mlp=1024, layers=4)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, **loading.dtype_kwargs(torch.bfloat16)).cuda().eval()
    pool = tiermem.Pool(backend="cuda", hbm_limit=12 * MIB, host_limit="1GiB", chunk="2MiB")
    handle = tt.from_pretrained(path, pool, quiet=True, staging_bytes=1 * MIB)
    assert handle.bytes > 2 * pool.hbm_cap
    cut = [e for s in handle.sites for e in s.experts]
    assert len(cut) == 4 and all(e.by_tensor for e in cut), "fused experts cut by tensor, as offload cuts them"
    ids = torch.randint(0, 512, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
        for _ in range(2):
            assert torch.equal(handle.model(ids).logits, expected)
