"""Where the MoE decode's traffic beyond the simulated replay comes from (issue 15): the
benchmark's Mixtral-style model offloaded as torch_bench.py does, its bytes paged in per pass
(prefill and each decode step), what each step of one pass paged in, and the schedule it
recorded replayed on the simulated device with the same window and cap (the traffic the plan
alone gives, with no timing). Prints and writes OUT/moe-traffic.json.

Usage (on the GPU machine): python3 scripts/gpu/probes/moe_traffic.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch_bench as tb  # noqa: E402
import torch_moe  # noqa: E402

import tiermem  # noqa: E402
import tiermem.torch as tt  # noqa: E402
from tiermem.units import phase_buffers  # noqa: E402

MiB = 1 << 20


def bytes_in(pool) -> int:
    return pool.stats()["transfers"]["bytes_in"]


def replay(schedule, cap: int, chunk: int, window: int, passes: int = 3) -> tuple[int, str]:
    """The recorded schedule on the simulated device: bytes paged in during the last pass
    and its pattern ('.' nothing, '+' under 8 MiB, '#' more)."""
    pool = tiermem.Pool(backend="sim", hbm_limit=cap, chunk=chunk)
    made: dict[int, object] = {}
    steps = []
    for buffers in schedule:
        step = []
        for b in buffers:
            if b.id not in made:
                made[b.id] = pool.alloc(b.size)
                made[b.id].write(b"\0")
            step.append(made[b.id])
        steps.append(step)
    pool.set_schedule(steps)
    for _ in range(passes):
        before, marks = bytes_in(pool), []
        for i, step in enumerate(steps):
            at = bytes_in(pool)
            pool.advance(i, window)
            for b in step:
                pool.acquire(b, 0, False)
            pool.release(step, 0)
            paged = bytes_in(pool) - at
            marks.append("." if paged == 0 else "+" if paged < 8 * MiB else "#")
        moved = bytes_in(pool) - before
    return moved, "".join(marks)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    model, cap, config = torch_moe.mixtral(False, "12-layer")
    size = tb.nbytes(model)
    prompt = torch.randint(0, config.vocab_size, (16, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(23))
    pool = tiermem.Pool(hbm_limit=cap)
    handle = tt.offload(model, pool, prefetch_bytes=256 * MiB)
    torch.cuda.empty_cache()
    for _ in range(2):
        tb.decode(model, prompt, 8)
    marks = []
    root = model.register_forward_pre_hook(lambda m, a: marks.append(bytes_in(pool)))
    tb.decode(model, prompt, 8)
    root.remove()
    marks.append(bytes_in(pool))
    per_pass = [b - a for a, b in zip(marks, marks[1:])]
    before = pool.stats()["transfers"]
    # One decode pass, each hooked module's bytes (read after tiermem's own pre-hook).
    steps: list[tuple[str, int]] = []
    hooks = [s.module.register_forward_pre_hook(lambda m, a, s=s: steps.append((s.name, bytes_in(pool)))) for s in handle.sites]
    tb.decode(model, prompt, 1)
    for h in hooks:
        h.remove()
    after = pool.stats()["transfers"]
    schedule = [phase_buffers(key.phase(phase)) for key, phase in handle.schedule]
    sim_moved, sim_pattern = replay(schedule, pool.hbm_cap, pool.chunk_size, handle.window_bytes)
    result = {
        "model_bytes": size, "cap": cap, "pool_hbm_cap": pool.hbm_cap, "chunk": pool.chunk_size,
        "window_bytes": handle.window_bytes, "optimum": size - cap,
        "per_pass_bytes": per_pass, "per_pass_vs_optimum": [p / (size - cap) for p in per_pass],
        "schedule_steps": len(schedule), "schedule_buffers": len({b.id for s in schedule for b in s}),
        "schedule_bytes": sum({b.id: b.size for s in schedule for b in s}.values()),
        "sim_replay_bytes": sim_moved, "sim_replay_vs_optimum": sim_moved / (size - cap), "sim_pattern": sim_pattern,
        "transfers_two_passes": {k: after[k] - before[k] for k in after if isinstance(after[k], (int, float))},
        "steps_two_passes": [(n, b - steps[0][1]) for n, b in steps],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "steps_two_passes"}, indent=1))
    (out / "moe-traffic.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
