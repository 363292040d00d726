"""Migration in a program that never synchronizes (issue 16): tiermem's own pauses.

As migrate_torch.py, A (cold, 0.9x the budget) fills HBM and B (hot, 0.5x) lands mostly on the
host; then rounds of reductions over B run for a few seconds with no synchronization at all:
each round's end is awaited by polling its event (`query`, which is not a synchronization).
Under tiermem, once TIERMEM_PAUSE_MS (1000) has passed without a quiesce point, a launch takes a
pause of tiermem's own and B comes up: the rounds after it run at the plain speed. Checks: every
byte of A and B equals what was written, every round's sums are bitwise the same.

Prints one JSON line; exits 1 on a failed check.

Usage:
  tiermem run --hbm-limit 2GiB --stats -- python3 scripts/gpu/probes/unsynced_torch.py
  TIERMEM_PAUSE_MS=0 tiermem run --hbm-limit 2GiB --stats -- python3 scripts/gpu/probes/unsynced_torch.py
"""
import json
import os
import sys
import time

import torch

budget = int(os.environ.get("TIERMEM_HBM_LIMIT", str(2 << 30)))
seconds = float(os.environ.get("UNSYNCED_SECONDS", "4"))
floats = lambda share: int(budget * share) // 4  # noqa: E731
gen = torch.Generator().manual_seed(0)
a_cpu = torch.randn(floats(0.9), generator=gen)
b_cpu = torch.randn(floats(0.5), generator=gen)
a = a_cpu.to("cuda")
b = b_cpu.to("cuda")
torch.cuda.synchronize()  # the last synchronization of the program until the checks

rounds, sums = [], []
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    sums.append(torch.stack([b.sum() for _ in range(20)]))
    end.record()
    while not end.query():
        time.sleep(0.0005)
    rounds.append((time.perf_counter() - t0, start.elapsed_time(end)))

reference = sums[0].cpu()
checks = {
    "a_bytes_identical": bool(torch.equal(a.cpu(), a_cpu)),
    "b_bytes_identical": bool(torch.equal(b.cpu(), b_cpu)),
    "sums_identical_every_round": all(torch.equal(s.cpu(), reference) for s in sums),
}
times = [ms for _, ms in rounds]
result = {
    "device": torch.cuda.get_device_name(0),
    "budget": budget,
    "pause_ms": os.environ.get("TIERMEM_PAUSE_MS", "1000") if "TIERMEM_HBM_LIMIT" in os.environ else "no tiermem",
    "rounds": len(rounds),
    "round_ms_first": round(times[0], 3),
    "round_ms_median_last_half": round(sorted(times[len(times) // 2:])[len(times[len(times) // 2:]) // 2], 3),
    "round_ms_by_second": {int(t): round(ms, 3) for t, ms in rounds},
    "checks": checks,
}
print(json.dumps(result))
sys.exit(0 if all(checks.values()) else 1)
