"""Replays the steady cycle (its length planned most often; the last of them) in a TIERMEM_TRACE file (transparent mode, docs/transparent.md)
offline: the chunks brought up per cycle by stage 3's greedy segments (segments.rs, capped at a
fraction of the budget) against Belady's MIN on demand, launch by launch — about the fewest bytes any
policy that keeps each launch's chunks in HBM could bring up for the same touched sets (chunks
weighed by their size, as the plan weighs them; older traces, with a budget in chunks, count
chunks). Three cycles in a row from an empty HBM; the last two are the steady state.

Usage: python3 scripts/gpu/probes/replay_plan.py TRACE.jsonl[.xz]
"""

import bisect
import json
import lzma
import sys
from collections import Counter, defaultdict

FAR = 1 << 62


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        events = [json.loads(line) for line in f]
    plans = [e for e in events if e["event"] == "plan"]
    if not plans:
        sys.exit(f"{path}: no plan (was the trace taken with segments on?)")
    # The steady state: the cycle length planned most often (the longest of those tied).
    lengths = Counter(len(e["launches"]) for e in plans)
    steady = max(lengths, key=lambda n: (lengths[n], n))
    return [e for e in plans if len(e["launches"]) == steady][-1]


def next_use_index(trace):
    uses = defaultdict(list)
    for i, touched in enumerate(trace):
        for c in set(touched):
            uses[c].append(i)

    def next_use(c, start):
        u = uses.get(c)
        if not u:
            return FAR
        k = bisect.bisect_left(u, start)
        return u[k] if k < len(u) else FAR

    return next_use


def greedy_cuts(launches, sizes, cap):
    """segments.rs's cut: each segment as long as its working set's bytes fit in `cap`."""
    cuts, current, held = [], None, 0
    for i, touched in enumerate(launches):
        own = set(touched)
        if current is not None and held + sum(sizes[c] for c in own - current[1]) <= cap:
            held += sum(sizes[c] for c in own - current[1])
            current[1].update(own)
        else:
            if current:
                cuts.append(current)
            current, held = [i, own], sum(sizes[c] for c in own)
    if current:
        cuts.append(current)
    return cuts


def make_room(hbm, used, needed, budget, keep, next_use, at):
    """Sends down the chunks not in `keep` used furthest ahead until `needed` more bytes fit."""
    for c in sorted((c for c in hbm if c not in keep), key=lambda c: -next_use(c, at)):
        if used + needed <= budget:
            break
        hbm.discard(c)
        used -= SIZES[c]
    return used


def segments(launches, budget, cap, cycles=3):
    n = len(launches)
    next_use = next_use_index(launches * cycles)
    cuts = [(start + r * n, chunks) for r in range(cycles) for start, chunks in greedy_cuts(launches, SIZES, cap)]
    hbm, used, ups, pauses = set(), 0, [0] * cycles, [0] * cycles
    for k, (start, chunks) in enumerate(cuts):
        end = cuts[k + 1][0] if k + 1 < len(cuts) else n * cycles
        up = [c for c in chunks if c not in hbm]
        needed = sum(SIZES[c] for c in up)
        used = make_room(hbm, used, needed, budget, chunks, next_use, end) + needed
        hbm.update(up)
        ups[start // n] += needed
        pauses[start // n] += bool(up)
    return ups, pauses


def belady(launches, budget, cycles=3):
    n = len(launches)
    trace = launches * cycles
    next_use = next_use_index(trace)
    hbm, used, ups = set(), 0, [0] * cycles
    for i, touched in enumerate(trace):
        need = [c for c in set(touched) if c not in hbm]
        if not need:
            continue
        needed = sum(SIZES[c] for c in need)
        used = make_room(hbm, used, needed, budget, set(touched), next_use, i + 1) + needed
        hbm.update(need)
        ups[i // n] += needed
    return ups


SIZES = []


def main():
    plan = load(sys.argv[1])
    launches, budget = plan["launches"], plan["budget"]
    # Since the working sets are weighed in bytes the plan names each chunk's size and a budget
    # in bytes; older traces counted chunks.
    SIZES[:] = plan.get("sizes") or [1] * len(plan["in_hbm"])
    unit, name = (1e9, "GB") if "sizes" in plan else (1, "chunks")
    touched = {c for t in launches for c in t}
    print(f"{len(launches)} launches, budget {budget / unit:.2f} {name}, {len(plan['in_hbm'])} chunks "
          f"({sum(SIZES) / unit:.2f} {name}), {len(touched)} touched ({sum(SIZES[c] for c in touched) / unit:.2f} {name}), "
          f"largest launch {max(len(t) for t in launches)} chunks; planned segments {plan['segments']}")
    print(f"MIN on demand: {name} up per cycle {[round(x / unit, 2) for x in belady(launches, budget)]}")
    for fraction in (1.0, 0.8, 0.6, 0.5):
        ups, pauses = segments(launches, budget, budget * fraction)
        print(f"greedy segments capped at {fraction:.1f} of the budget: {name} up per cycle "
              f"{[round(x / unit, 2) for x in ups]}, pauses {pauses}")


if __name__ == "__main__":
    main()
