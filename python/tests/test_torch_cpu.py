"""tiermem.torch's own logic on the CPU, with a stand-in Pool whose buffers are CPU tensors:
tied weights, mixture-of-experts blocks, generate, training with AdamW, sleep/wake, remove and
from_pretrained give exactly the resident model's outputs, and every acquire is released.
(The engine itself is not exercised here: test_torch.py does that on a GPU.)"""

import gc
import itertools
import types
import weakref

import pytest

torch = pytest.importorskip("torch", reason="tiermem.torch needs PyTorch")
transformers = pytest.importorskip("transformers", reason="these tests build transformers models")
import tiermem.torch as tt  # noqa: E402
from tiermem import loading  # noqa: E402
import tiermem.units  # noqa: E402
from tiermem import experts as experts_module  # noqa: E402

class FakeBuffer:
    """A tiermem Buffer stand-in: bytes in a CPU tensor, exported through DLPack."""

    ids = itertools.count(1)

    def __init__(self, size, name, t=None):
        self.t = torch.zeros(max(size, 1), dtype=torch.uint8) if t is None else t
        self.size, self.name, self.id, self.ptr = size, name, next(self.ids), self.t.data_ptr()
        self.base, self.saved = None, None  # parts: the whole reservation; a strict pool's copy
        self.held = 0  # acquisitions not yet released
        self.written = False  # a strict pool: an acquisition since the last release asked to write

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def write(self, data, offset=0):
        """As ``Buffer.write``, acquired or not (a strict pool keeps the bytes of a buffer not
        acquired in ``saved``)."""
        a = torch.frombuffer(bytearray(memoryview(data)), dtype=torch.uint8)
        (self.saved if self.saved is not None and not self.held else self.t)[offset : offset + len(a)] = a

    def free(self):
        pass


class FakePool:
    """A Pool stand-in that counts acquisitions (each must be released) and moves nothing;
    ``strict``: a buffer not acquired holds garbage (its bytes come back when acquired), so
    a read of memory not acquired changes the outputs, and what was written while no
    acquisition asked to write is lost (the engine drops a chunk acquired read-only without
    copying it down when it has a copy below)."""

    chunk_size, hbm_cap, closed, backend, device = 2 << 20, 64 << 20, False, "cuda", 0

    def __init__(self, strict=False):
        self.acq, self.strict = {}, strict
        # Weak: a buffer lives as long as the model's units (or anything else) keep it.
        self.buffers = weakref.WeakValueDictionary()
        self.paged_out, self.paged_in = [], []  # ids, in the order asked

    def alloc(self, size, name=None, in_place=False):
        return self._made(FakeBuffer(size, name))

    def alloc_parts(self, sizes, name=None, in_place=False):
        rounded = [-(-s // self.chunk_size) * self.chunk_size for s in sizes]
        base, at, parts = torch.zeros(sum(rounded), dtype=torch.uint8), 0, []
        for i, (size, r) in enumerate(zip(sizes, rounded)):
            parts.append(self._made(FakeBuffer(size, f"{name}[{i}]", base[at : at + size])))
            parts[-1].base, at = base, at + r
        return parts

    def _made(self, buffer):
        self.buffers[buffer.id] = buffer
        if self.strict:
            buffer.saved = buffer.t.clone()
            buffer.t.fill_(0xFF)  # NaN in every float type
        return buffer

    def acquire(self, buffers, stream=0, write=False):
        for b in buffers if isinstance(buffers, list) else [buffers]:
            if self.strict and self.acq.get(b.id, 0) == 0:
                b.t.copy_(b.saved)
                b.written = False
            b.written = b.written or write
            self.acq[b.id] = self.acq.get(b.id, 0) + 1
            b.held += 1

    def release(self, buffers, stream=0):
        for b in buffers if isinstance(buffers, list) else [buffers]:
            assert self.acq.get(b.id, 0) > 0, "release of a buffer not acquired"
            self.acq[b.id] -= 1
            b.held -= 1
            if self.strict and self.acq[b.id] == 0:
                if b.written:
                    b.saved.copy_(b.t)
                b.t.fill_(0xFF)

    def acquired(self, buffers, stream=0, write=False):
        pool = self

        class Acquisition:
            def __enter__(self):
                for b in buffers if isinstance(buffers, list) else [buffers]:
                    pool.acquire(b, write=write)

            def __exit__(self, *exc):
                pool.release(buffers)

        return Acquisition()

    recorded_steps = ()  # the engine's recorder is tested in Rust and in test_pool.py

    def pass_begins(self):
        pass

    def step_enters(self, key, buffers, prefetch_bytes):
        return None

    def step_also_uses(self, buffers):
        return False

    def clear_schedule(self):
        pass

    def forget_steps(self, keys):
        pass

    def page_out_start(self, buffer):
        self.paged_out.append(buffer.id)
        return 1

    def page_in_start(self, buffer):
        self.paged_in.append(buffer.id)
        return 2

    def finish(self, ticket):
        pass

    def release_idle_hbm(self):
        return 123

    def stats(self):
        return {"hbm": {"capacity_bytes": self.hbm_cap, "used_bytes": 0}, "chunk_size": self.chunk_size, "buffers": []}

    def prefetch(self, buffers):
        pass


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setattr(tt, "_require_gpu", lambda pool, call: torch.device("cpu"))
    monkeypatch.setattr(experts_module, "_span", lambda parts: parts[0].base[: parts[-1].ptr + parts[-1].size - parts[0].ptr])
    monkeypatch.setattr(tt, "_stream", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(synchronize=lambda: None, cuda_stream=0))


@pytest.fixture(params=["packed", "unpacked", "runs"])
def packing(request, monkeypatch):
    """Small units packed together (the default), each in a buffer of its own, or each in its
    own but in chunks of 12 KiB, where consecutive ones merge into runs that round up less."""
    if request.param != "packed":
        monkeypatch.setattr(tiermem.units, "SMALL", 0)
    if request.param == "runs":
        monkeypatch.setattr(FakePool, "chunk_size", 12 << 10)


def llama(tied, layers=2, dtype=torch.float32, seed=0):
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def mixtral():
    cfg = transformers.MixtralConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg).eval()


IDS = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("make", [lambda: llama(True), lambda: llama(False), mixtral], ids=["tied", "untied", "moe"])
def test_inference_sleep_wake_and_remove_give_the_resident_outputs(cpu, packing, make):
    ref, m = make(), make()
    pool = FakePool()
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    tied = m.lm_head.weight is m.model.embed_tokens.weight
    with torch.no_grad():
        e = ref(IDS).logits
        for _ in range(3):
            assert torch.equal(m(IDS).logits, e)
        kw = dict(max_new_tokens=4, do_sample=False)
        assert torch.equal(m.generate(IDS, **kw), ref.generate(IDS, **kw))
    assert all(v == 0 for v in pool.acq.values()), pool.acq
    assert h.sleep() == 123
    w = h.wake(block=False)
    w.wait()
    assert w.done()
    h.remove()
    gc.collect()
    assert not pool.buffers, f"remove() left {len(pool.buffers)} buffers alive while its Offload lives"
    assert (m.lm_head.weight is m.model.embed_tokens.weight) == tied
    with torch.no_grad():
        assert torch.equal(m(IDS).logits, e)


def test_bad_arguments_name_the_call_and_the_argument(cpu):
    with pytest.raises(tiermem.InvalidArgumentError, match="offload: the model is a str, not a torch.nn.Module"):
        tt.offload("llama", FakePool())
    m = llama(True)
    for bad in ["lots", -1, None, 1.5]:
        with pytest.raises(tiermem.InvalidArgumentError, match="offload: prefetch_bytes: "):
            tt.offload(m, FakePool(), prefetch_bytes=bad)
    assert not hasattr(m, "_tiermem_offload"), "the model is left as it was"
    for bad in ["lots", -1, None, 1.5]:
        with pytest.raises(tiermem.InvalidArgumentError, match="offload_activations: min_bytes: "):
            tt.offload_activations(FakePool(), min_bytes=bad)
    for bad in [-1, 1.5, "2", True]:
        with pytest.raises(tiermem.InvalidArgumentError, match="offload_activations: prefetch is "):
            tt.offload_activations(FakePool(), prefetch=bad)


def test_training_a_tied_model_with_adamw_gives_the_same_losses(cpu, packing):
    def train(offload):
        m = llama(True).train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        pool = FakePool()
        h = tt.offload(m, pool, optimizer=opt) if offload else None
        losses = []
        for _ in range(3):
            loss = m(IDS, labels=IDS).loss
            loss.backward()
            if offload:
                assert all(v == 0 for v in pool.acq.values()), pool.acq
                h.step()
            else:
                opt.step()
                opt.zero_grad(set_to_none=False)
            losses.append(loss.item())
        assert len(opt.state) == len(list(m.parameters()))
        return losses

    assert train(True) == train(False)


def test_from_pretrained_gives_the_logits_of_transformers_loading(cpu, tmp_path):
    llama(True, dtype=torch.bfloat16).save_pretrained(tmp_path, max_shard_size="100KB")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, **loading.dtype_kwargs(torch.bfloat16)).eval()
    h = tt.from_pretrained(tmp_path, FakePool(), quiet=True, staging_bytes=64 << 10)
    assert h.model.lm_head.weight is h.model.model.embed_tokens.weight
    with torch.no_grad():
        assert torch.equal(h.model(IDS).logits, ref(IDS).logits)


def test_from_pretrained_reads_a_mixtral_saved_expert_by_expert_into_experts_cut_by_tensor(cpu, monkeypatch, tmp_path):
    """transformers saves a Mixtral's fused experts one expert and projection at a time;
    from_pretrained reads each into its place (tiermem.conversions) and, for a grouped
    implementation, cuts the fused tensors by tensor as offload does."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)
    mixtral().to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="200KB")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, **loading.dtype_kwargs(torch.bfloat16)).eval()
    pool = FakePool()
    h = tt.from_pretrained(tmp_path, pool, quiet=True, staging_bytes=64 << 10)
    if h.model.config._experts_implementation not in (None, "eager"):
        cut = [e for s in h.sites for e in s.experts]
        assert len(cut) == 2 and all(e.by_tensor for e in cut)
    with torch.no_grad():
        assert torch.equal(h.model(IDS).logits, ref(IDS).logits)
    _generates_alike_then_removes(h, h.model, ref, pool)


MOE_FAMILIES = {  # other mixture-of-experts families whose checkpoints transformers converts on load
    "qwen2_moe": lambda c: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64, **c)),
    "olmoe": lambda c: transformers.OlmoeForCausalLM(transformers.OlmoeConfig(num_experts=4, num_experts_per_tok=2, **c)),
    "qwen3_moe": lambda c: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, **c)),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_from_pretrained_reads_other_moe_families_as_transformers_does(cpu, monkeypatch, tmp_path, family):
    monkeypatch.setattr(tiermem.units, "WASTE", 0)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(0)
    MOE_FAMILIES[family](common).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="300KB")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, **loading.dtype_kwargs(torch.bfloat16)).eval()
    h = tt.from_pretrained(tmp_path, FakePool(), quiet=True, staging_bytes=64 << 10)
    with torch.no_grad():
        assert torch.equal(h.model(IDS).logits, ref(IDS).logits)


def test_from_pretrained_converts_a_float32_checkpoint_as_transformers_does(cpu, tmp_path):
    """Tensors of another dtype are read raw and converted (rows cut by a small staging area)."""
    llama(False).save_pretrained(tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, **loading.dtype_kwargs(torch.bfloat16)).eval()
    h = tt.from_pretrained(tmp_path, FakePool(), dtype=torch.bfloat16, quiet=True, staging_bytes=16 << 10)
    assert h.model.lm_head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(h.model(IDS).logits, ref(IDS).logits)


def test_the_window_paged_ahead_is_at_most_a_share_of_the_cap(cpu):
    pool, steps = FakePool(), []
    pool.step_enters = lambda key, buffers, budget: steps.append(budget)
    h = tt.offload(llama(True), pool, prefetch_bytes="1GiB")
    for _ in range(2):
        with torch.no_grad():
            h.model(IDS)
    assert h.window_bytes == pool.hbm_cap // tt.WINDOW_SHARE and steps and set(steps) == {pool.hbm_cap // tt.WINDOW_SHARE}
    h.prefetch_bytes = 1 << 20
    assert h.window_bytes == 1 << 20


@pytest.mark.parametrize("implementation", ["eager", "batched_mm", "grouped_mm"])
def test_fused_experts_cut_by_expert_are_acquired_as_the_forward_uses_them(cpu, monkeypatch, implementation):
    """An eager model's experts are cut (tiermem.units: each expert a part in a buffer of its
    own); a strict pool makes memory not acquired read as NaN, so identical outputs prove that
    the eager loop acquires each expert it indexes, and that a grouped implementation switched
    to afterwards (one kernel over all experts) acquires them all. The first pass records
    every expert as a step, in order, even those its tokens skip; remove() gives the fused
    tensors back whole."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)  # cut however much rounding wastes
    ref, m = mixtral(), mixtral()
    for model in (ref, m):
        model.config._experts_implementation = "eager"
    pool, steps = FakePool(strict=True), []
    enters = pool.step_enters
    pool.step_enters = lambda key, buffers, budget: steps.append((key, [b.id for b in buffers])) or enters(key, buffers, budget)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    block = [s for s in h.sites if s.experts][0]
    gate_up = block.module.experts.gate_up_proj
    assert type(gate_up) is experts_module.ExpertWeights and not gate_up.is_contiguous()
    assert len(block.experts[0].units) == 4 and all(u.lazy for u in block.experts[0].units)
    with torch.no_grad():
        e = ref(IDS[:, :1]).logits  # two tokens choose at most four experts a layer
        assert torch.equal(m(IDS[:, :1]).logits, e)
        part_ids = {u.parts["weights"].id: k for k, u in enumerate(block.experts[0].units)}
        first = [part_ids[ids[0]] for _, ids in steps if ids and ids[0] in part_ids]
        assert first == [0, 1, 2, 3], first
        for model in (ref, m):
            model.config._experts_implementation = implementation
        for _ in range(2):
            assert torch.equal(m(IDS).logits, ref(IDS).logits)
    _generates_alike_then_removes(h, m, ref, pool)
    assert m.model.layers[0].mlp.experts.gate_up_proj.is_contiguous()


def _generates_alike_then_removes(h, m, ref, pool):
    """Greedy generation gives the resident model's tokens, every acquire is released, and
    after remove() the fused tensors are ordinary parameters giving the same outputs."""
    with torch.no_grad():
        kw = dict(max_new_tokens=3, do_sample=False)
        assert torch.equal(m.generate(IDS, **kw), ref.generate(IDS, **kw))
    assert all(v == 0 for v in pool.acq.values()), pool.acq
    h.remove()
    assert type(m.model.layers[0].mlp.experts.gate_up_proj) is torch.nn.Parameter
    with torch.no_grad():
        assert torch.equal(m(IDS).logits, ref(IDS).logits)


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
def test_fused_experts_read_in_one_kernel_are_cut_by_tensor(cpu, monkeypatch, implementation):
    """A grouped implementation's fused tensors are each a buffer of their own, acquired when
    the forward first reads them: the schedule holds the block, then its up projection, then
    its down projection. A strict pool turns memory not acquired into NaN, so identical outputs
    prove each is acquired before it is read; switched to eager afterwards (indexing one expert
    at a time) it stays identical; remove() gives the tensors back."""
    monkeypatch.setattr(tiermem.units, "WASTE", 0)  # cut however much rounding wastes
    ref, m = mixtral(), mixtral()
    for model in (ref, m):
        model.config._experts_implementation = implementation
    pool, steps = FakePool(strict=True), []
    enters = pool.step_enters
    pool.step_enters = lambda key, buffers, budget: steps.append([b.id for b in buffers]) or enters(key, buffers, budget)
    h = tt.offload(m, pool, prefetch_bytes=1 << 20)
    block = [s for s in h.sites if s.experts][0]
    cut = block.experts[0]
    assert cut.by_tensor and [o.name.rsplit(".", 1)[1] for o in cut.tensors] == ["gate_up_proj", "down_proj"]
    gate_up = block.module.experts.gate_up_proj
    assert type(gate_up) is experts_module.ExpertWeights and gate_up.is_contiguous()
    ids = [u.parts["weights"].id for u in cut.units]
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(m(IDS).logits, ref(IDS).logits)
        assert [step for step in steps if set(step) & set(ids)] == [[ids[0]], [ids[1]]] * 2, steps
        for model in (ref, m):
            model.config._experts_implementation = "eager"
        assert torch.equal(m(IDS).logits, ref(IDS).logits)
    _generates_alike_then_removes(h, m, ref, pool)


def test_fused_experts_stay_whole_when_training_with_an_optimizer(cpu, monkeypatch):
    monkeypatch.setattr(tiermem.units, "WASTE", 0)
    m = mixtral().train()
    h = tt.offload(m, FakePool(), optimizer=torch.optim.AdamW(m.parameters()))
    assert not any(s.experts for s in h.sites)


def test_units_that_round_up_less_together_are_merged_into_runs():
    """At 12 KiB chunks a float32 llama's projections (8, 16 and 32 KiB) round up less in runs
    (q_proj's 16 KiB and the 8 KiB after it take 24 KiB together against 36 apart); the MLP's
    32 KiB tensors gain nothing together and stay apart. A run holds consecutive units, each
    site acquires its run, and uses only its own tensors."""
    chunk = 12 << 10
    rounded = lambda units: sum(-(-u.weight_bytes // chunk) * chunk for u in units)  # noqa: E731
    units, sites = tiermem.units.plan(llama(False, layers=1), small=0, pack=chunk)
    apart, _ = tiermem.units.plan(llama(False, layers=1), small=0, pack=0)  # pack 0: nothing packed or merged
    assert rounded(units) < rounded(apart)
    names = [u.name for u in units]
    assert "model.layers.0.mlp.gate_proj" in names and "model.layers.0.mlp.up_proj" in names, names
    runs = [u for u in units if u.name.startswith("run:")]
    assert runs and "run:model.layers.0.self_attn.v_proj+1" in names, names
    order = [o.name for u in apart for o in u.tensors]
    for run in runs:
        members = [o.name for o in run.tensors]
        start = order.index(members[0])
        assert order[start : start + len(members)] == members, "a run is consecutive units"
        acquirers = [s for s in sites if s.units[0] is run]
        assert len(acquirers) >= 2, run.name
        for site in acquirers:
            assert all(o.name.startswith(site.name + ".") for o in site.uses), (site.name, [o.name for o in site.uses])
