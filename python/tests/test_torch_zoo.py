"""tiermem.torch on model families beyond Llama and Mixtral, on the CPU with test_torch_cpu.py's
strict stand-in Pool (memory not acquired reads as NaN): each tiny model, offloaded, gives the
resident model's logits pass after pass and its greedy tokens, releases everything it acquired,
and after remove() is an ordinary model again. Families: tied Conv1D (GPT-2), tied embeddings
with scaled norms (Gemma, Gemma 2, Qwen2), fused projections (Phi-3), learned positions and a
projection (OPT), shared experts (Qwen2-MoE), experts with norms (OLMoE), an encoder-decoder
(T5) and an encoder (BERT). Each also trains (AdamW) with the resident model's losses, and
loads from its checkpoint (`from_pretrained`) as transformers loads it."""

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem.torch as tt  # noqa: E402
import tiermem.units  # noqa: E402
from test_torch_cpu import IDS, FakePool, cpu  # noqa: E402, F401  (cpu: a fixture)

LLAMA_LIKE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip

FAMILIES = {  # name: (model class, config class, config arguments)
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128)),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(head_dim=16, **LLAMA_LIKE)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(head_dim=16, **LLAMA_LIKE)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=True, **LLAMA_LIKE)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(pad_token_id=0, **LLAMA_LIKE)),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(vocab_size=512, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                                num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=64)),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                                                shared_expert_intermediate_size=64, **LLAMA_LIKE)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, **LLAMA_LIKE)),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(vocab_size=512, d_model=64, d_ff=128, num_layers=2, num_heads=4,
                                                         d_kv=16, decoder_start_token_id=0, pad_token_id=0)),
    "bert": ("BertForMaskedLM", "BertConfig", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, max_position_embeddings=128)),
}  # fmt: skip


def _make(family: str):
    model_class, config_class, arguments = FAMILIES[family]
    if not hasattr(transformers, model_class):
        pytest.skip(f"transformers {transformers.__version__} has no {model_class}")
    torch.manual_seed(0)
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**arguments)).eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_of_another_family_offloaded_gives_its_outputs(cpu, monkeypatch, family):
    monkeypatch.setattr(tiermem.units, "WASTE", 0)  # fused experts cut apart, however small
    ref, m = _make(family), _make(family)
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    kwargs = dict(decoder_input_ids=IDS[:, :4]) if family == "t5" else {}
    with torch.no_grad():
        expected = ref(IDS, **kwargs).logits
        for _ in range(3):
            assert torch.equal(m(IDS, **kwargs).logits, expected)
        if family != "bert":
            generate = dict(max_new_tokens=3, do_sample=False)
            assert torch.equal(m.generate(IDS, **generate), ref.generate(IDS, **generate))
    assert all(v == 0 for v in pool.acq.values()), pool.acq
    h.remove()
    with torch.no_grad():
        assert torch.equal(m(IDS, **kwargs).logits, expected)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_of_another_family_trains_through_tiermem_as_it_does_resident(cpu, family):
    """AdamW steps with the weights, gradients and moments in tiermem (eval mode: no dropout,
    so the losses must match bitwise)."""
    ref, m = _make(family), _make(family)
    optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-3) for model in (ref, m)]
    pool = FakePool(strict=True)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20, optimizer=optimizers[1])
    labels = IDS[:, :4].contiguous() if family == "t5" else IDS
    kwargs = dict(decoder_input_ids=IDS[:, :4], labels=labels) if family == "t5" else dict(labels=labels)
    for _ in range(3):
        expected = ref(IDS, **kwargs).loss
        expected.backward()
        optimizers[0].step()
        optimizers[0].zero_grad()
        loss = m(IDS, **kwargs).loss
        loss.backward()
        h.step()
        assert torch.equal(loss, expected)
    assert all(v == 0 for v in pool.acq.values()), pool.acq


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_of_another_family_loads_from_its_checkpoint_as_transformers_loads_it(cpu, monkeypatch, tmp_path, family):
    from tiermem import loading

    monkeypatch.setattr(tiermem.units, "WASTE", 0)
    _make(family).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="300KB")
    auto = {"t5": transformers.AutoModelForSeq2SeqLM, "bert": transformers.AutoModelForMaskedLM}
    ref = auto.get(family, transformers.AutoModelForCausalLM).from_pretrained(tmp_path, **loading.dtype_kwargs(torch.bfloat16))
    kwargs = dict(model_class=type(ref)) if family in auto else {}
    h = tt.from_pretrained(tmp_path, FakePool(strict=True), quiet=True, staging_bytes=64 << 10, **kwargs)
    inputs = dict(decoder_input_ids=IDS[:, :4]) if family == "t5" else {}
    with torch.no_grad():
        assert torch.equal(h.model(IDS, **inputs).logits, ref.eval()(IDS, **inputs).logits)
