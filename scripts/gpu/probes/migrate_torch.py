"""Migration on a real GPU (issue 16, stage 2), seen from an unmodified PyTorch program.

A (cold, 0.9x the budget) is allocated first and fills HBM; B (hot, 0.5x the budget) lands
mostly on the host. Both are filled by copies from the CPU, so no kernel has touched either.
Then round 1 launches reductions over B (slow: B is read over PCIe) and waits on an event: the
wait is a quiesce point, where B's hot chunks come up and A's cold ones go down. Rounds 2 and
3 repeat the reductions (fast if B moved). Checks: every byte of A and B equals what was
written, the reductions give bitwise the same sums in every round. Also times a loop of tiny
launches (the cost of the gate and the argument scan per launch): compare with a plain run.

Prints one JSON line; exits 1 on a failed check.

Usage:
  tiermem run --hbm-limit 2GiB --stats -- python3 scripts/gpu/probes/migrate_torch.py
  TIERMEM_MIGRATE=off tiermem run --hbm-limit 2GiB --stats -- python3 scripts/gpu/probes/migrate_torch.py
  python3 scripts/gpu/probes/migrate_torch.py          # plain: sizes from a 2 GiB "budget"
"""
import json
import os
import sys
import time

import torch

budget = int(os.environ.get("TIERMEM_HBM_LIMIT", str(2 << 30)))
floats = lambda share: int(budget * share) // 4  # noqa: E731
gen = torch.Generator().manual_seed(0)
a_cpu = torch.randn(floats(0.9), generator=gen)
b_cpu = torch.randn(floats(0.5), generator=gen)
a = a_cpu.to("cuda")  # copies only: no kernel has seen A or B yet
b = b_cpu.to("cuda")
torch.cuda.synchronize()
# Those synchronizations were quiesce points with no heat: wait out the interval between two
# evaluations (TIERMEM_MIGRATE_INTERVAL_MS, 100 ms) so that round 1's wait is evaluated.
time.sleep(0.2)


def round_ms(reps=20):
    """Reductions over B, timed by events; the wait on the end event is a quiesce point."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sums = []
    start.record()
    for _ in range(reps):
        sums.append(b.sum())
    end.record()
    end.synchronize()
    return start.elapsed_time(end), torch.stack(sums).cpu()


rounds = [round_ms() for _ in range(3)]
time.sleep(0.2)  # past the default interval between evaluations (100 ms)
rounds.append(round_ms())

small = torch.zeros(256, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
launches = 20000
for _ in range(launches):
    small.add_(1)
torch.cuda.synchronize()
launch_us = (time.perf_counter() - t0) / launches * 1e6

checks = {
    "a_bytes_identical": bool(torch.equal(a.cpu(), a_cpu)),
    "b_bytes_identical": bool(torch.equal(b.cpu(), b_cpu)),
    "sums_identical_every_round": all(torch.equal(r[1], rounds[0][1]) for r in rounds),
    "small_counted": float(small[0].item()) == launches,
}
free, total = torch.cuda.mem_get_info()
result = {
    "device": torch.cuda.get_device_name(0),
    "budget": budget,
    "migrate": os.environ.get("TIERMEM_MIGRATE", "on") if "TIERMEM_HBM_LIMIT" in os.environ else "no tiermem",
    "round_ms": [round(r[0], 3) for r in rounds],
    "speedup_round2_vs_1": round(rounds[0][0] / rounds[1][0], 2),
    "b_gb_per_s_round1": round(b.numel() * 4 * 20 / rounds[0][0] / 1e6, 1),
    "b_gb_per_s_last": round(b.numel() * 4 * 20 / rounds[-1][0] / 1e6, 1),
    "tiny_launch_us": round(launch_us, 2),
    "mem_get_info": [free, total],
    "checks": checks,
}
print(json.dumps(result))
sys.exit(0 if all(checks.values()) else 1)
