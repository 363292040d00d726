"""The workload of `tiermem bench transparent` (issue 16): an unmodified PyTorch training loop —
a Llama-style transformer (random weights, eager attention, fp32, AdamW) trained for a few
steps on fixed random tokens, deterministic so that two runs give bitwise identical losses.
It knows nothing of tiermem: the benchmark runs it plainly, under `tiermem run` with several
budgets, and with the stock allocator capped by `--memory-fraction` (which should run out of
memory). Writes one JSON object to --out: losses, the median step time, the allocator's peaks,
and `oom` (true if a CUDA out-of-memory error stopped it; `stopped`: SIGTERM did, the steps
before it are written).

Usage: python bench/transparent_train.py --out FILE [--steps 8] [--memory-fraction F] [--small]
       [--batches 8,4,6,2]  (the batch of each step in turn: shapes that change from step to step)
       [--sync-every K]     (synchronize, and read the losses, only every K steps, as a loop that
                             logs every K steps does; the step time is then each K steps' ÷ K)
"""

import argparse
import json
import os
import signal
import statistics
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import transformers  # noqa: E402


class Stopped(Exception):
    """SIGTERM arrived: the loop stops and what it measured is written (`stopped` in the JSON)."""


def stop(_signum, _frame):
    raise Stopped()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--memory-fraction", type=float, default=None,
                        help="cap the stock caching allocator at this fraction of the GPU's memory")
    parser.add_argument("--small", action="store_true", help="a model of a few hundred MiB (a smoke test)")
    parser.add_argument("--sync-every", type=int, default=1,
                        help="synchronize and read the losses only every K steps (default 1: every step)")
    parser.add_argument("--batches", default=None,
                        help="comma-separated batch sizes, one per step in turn (default: the model's one batch)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, stop)
    torch.use_deterministic_algorithms(True)
    if args.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    free, total = torch.cuda.mem_get_info()
    result = {"mem_get_info_total": total, "mem_get_info_free_at_start": free, "oom": False, "losses": [],
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    hidden, layers, heads, mlp, batch, seq = (256, 2, 4, 1024, 2, 128) if args.small else (1024, 8, 16, 4096, 8, 1024)
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=seq,
        attn_implementation="eager",
    )  # fmt: skip
    times, ends = [], []  # each step's seconds, and when it ended (Unix time: probes line steps up with events)
    try:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator("cuda").manual_seed(1)
        ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=gen)
        batches = [int(b) for b in args.batches.split(",")] if args.batches else None
        every, pending = max(args.sync_every, 1), []
        t0 = time.perf_counter()
        for step in range(args.steps):
            rows = ids[: batches[step % len(batches)]] if batches else ids
            if every == 1:  # the benchmark's loop: a synchronization before each step, the loss read after
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=rows, labels=rows).loss
            loss.backward()
            opt.step()
            pending.append(loss.detach())
            if len(pending) == every or step == args.steps - 1:
                result["losses"] += [p.item() for p in pending] if every == 1 else torch.stack(pending).tolist()
                times += [(time.perf_counter() - t0) / len(pending)] * len(pending)
                ends += [time.time()] * len(pending)
                pending = []
                t0 = time.perf_counter()
    except torch.OutOfMemoryError as e:
        result["oom"], result["error"] = True, str(e).splitlines()[0]
    except Stopped:
        result["stopped"] = True  # SIGTERM (a time limit): the steps so far are written
    settled = times[every:] if len(times) > every else times[1:]  # the first block warms up
    result["step_s_median"] = statistics.median(settled) if settled else None
    result["sync_every"] = args.sync_every
    result["step_s"] = times
    result["step_end_unix"] = ends
    try:
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    except RuntimeError as e:  # a pluggable allocator (tiermem run --torch-allocator) keeps no statistics
        result["max_memory_allocated"] = result["max_memory_reserved"] = None
        result["memory_stats_error"] = str(e).splitlines()[0]
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
