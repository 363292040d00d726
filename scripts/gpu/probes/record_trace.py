"""Records the engine calls of tiermem.torch decoding the benchmark's tied Llama (bench/torch_bench.py)
on the GPU, for crates/engine/examples/replay_trace.rs to replay: on the simulated device, to
study the engine's traffic without a GPU, or on the GPU. Prints the bytes paged in per pass.
A probe, not a benchmark.

Usage: python scripts/gpu/probes/record_trace.py TRACE [WINDOW_MIB]
Then:  cargo run --release -p tiermem --example replay_trace -- TRACE eager [WINDOW_MIB]
"""

import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch_bench as tb  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402

MiB, GiB = tb.MiB, tb.GiB


class Recorder:
    """Stands in for a Pool: passes every call on and notes the schedule calls, acquires and
    releases, one line each (the trace format of replay_trace.rs)."""

    def __init__(self, pool):
        self._pool, self.lines = pool, []

    def __getattr__(self, name):
        fn = getattr(self._pool, name)
        if not callable(fn):
            return fn

        def call(*args, **kwargs):
            result = fn(*args, **kwargs)
            ids = lambda buffers: " ".join(str(b.id) for b in (buffers if isinstance(buffers, list) else [buffers]))  # noqa: E731
            if name == "pass_begins":
                self.lines.append("pass")
            elif name == "step_enters":
                self.lines.append(f"step {args[0]} {args[2]} {ids(args[1])}")
            elif name == "acquire":
                write = args[2] if len(args) > 2 else kwargs.get("write", False)
                self.lines.append(f"acquire {int(bool(write))} {ids(args[0])}")
            elif name == "release":
                self.lines.append(f"release {ids(args[0])}")
            return result

        return call


def main():
    out = Path(sys.argv[1])
    window = int(sys.argv[2]) << 20 if len(sys.argv) > 2 else 256 * MiB
    config = tb.llama_config(3072, 8192, 12, 24, 8)
    config.vocab_size, config.tie_word_embeddings = 128256, True
    model = tb.llama(config, 3, torch.bfloat16)
    size, cap = tb.nbytes(model), int(1.5 * GiB)
    pool = tiermem.Pool(hbm_limit=cap)
    handle = tt.offload(model, pool, prefetch_bytes=window)
    recorder = Recorder(pool)
    handle.pool = recorder
    prompt = torch.randint(0, config.vocab_size, (16, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(17))
    per_pass = []

    def timed_pass(ids, cache):
        before = pool.stats()["transfers"]["bytes_in"]
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        recorder.lines.append("mark")
        per_pass.append((pool.stats()["transfers"]["bytes_in"] - before) >> 20)
        return out.logits[:, -1:].argmax(-1)

    with torch.no_grad():
        for _ in range(3):
            cache = transformers.DynamicCache()
            token = timed_pass(prompt, cache)
            for _ in range(8):
                token = timed_pass(token, cache)
    print(f"window {handle.window_bytes >> 20} MiB; MiB paged in per pass: {per_pass}")
    buffers = [f"buffer {b['id']} {b['size']}" for b in pool.stats()["buffers"]]
    out.write_text("\n".join([f"cap {cap}", f"model {size}", *buffers, *recorder.lines]) + "\n")
    print(f"wrote {out} ({len(recorder.lines)} calls)")


if __name__ == "__main__":
    main()
