"""Replays the steady cycle (its length planned most often; the last of them) in a TIERMEM_TRACE file (transparent mode, docs/transparent.md)
offline: the chunks brought up per cycle by stage 3's greedy segments (segments.rs, capped at a
fraction of the budget) against Belady's MIN on demand, launch by launch — the fewest chunks any
policy that keeps each launch's chunks in HBM could bring up for the same touched sets. Three
cycles in a row; the last two are the steady state.

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


def greedy_cuts(launches, cap):
    """segments.rs's cut: each segment as long as its working set fits in `cap` chunks."""
    cuts, current = [], None
    for i, touched in enumerate(launches):
        own = set(touched)
        if current is not None and len(current[1] | own) <= cap:
            current[1].update(own)
        else:
            if current:
                cuts.append(current)
            current = [i, set(own)]
        if len(current[1]) > cap:
            cuts.append(current)
            current = None
    if current:
        cuts.append(current)
    return cuts


def segments(launches, budget, cap, cycles=3):
    n = len(launches)
    next_use = next_use_index(launches * cycles)
    cuts = [(start + r * n, chunks) for r in range(cycles) for start, chunks in greedy_cuts(launches, cap)]
    hbm, ups, pauses = set(range(budget)), [0] * cycles, [0] * cycles
    for k, (start, chunks) in enumerate(cuts):
        end = cuts[k + 1][0] if k + 1 < len(cuts) else n * cycles
        up = [c for c in chunks if c not in hbm]
        excess = len(hbm) + len(up) - budget
        if excess > 0:
            for c in sorted((c for c in hbm if c not in chunks), key=lambda c: -next_use(c, end))[:excess]:
                hbm.discard(c)
        hbm.update(up)
        ups[start // n] += len(up)
        pauses[start // n] += bool(up)
    return ups, pauses


def belady(launches, budget, cycles=3):
    n = len(launches)
    trace = launches * cycles
    next_use = next_use_index(trace)
    hbm, ups = set(range(budget)), [0] * cycles
    for i, touched in enumerate(trace):
        need = [c for c in set(touched) if c not in hbm]
        if not need:
            continue
        excess = len(hbm) + len(need) - budget
        if excess > 0:
            for c in sorted((c for c in hbm if c not in touched), key=lambda c: -next_use(c, i + 1))[:excess]:
                hbm.discard(c)
        hbm.update(need)
        ups[i // n] += len(need)
    return ups


def main():
    plan = load(sys.argv[1])
    launches, budget = plan["launches"], plan["budget"]
    touched = {c for t in launches for c in t}
    print(f"{len(launches)} launches, budget {budget} chunks, {len(plan['in_hbm'])} chunks, {len(touched)} touched, "
          f"largest launch {max(len(t) for t in launches)} chunks; planned segments {plan['segments']}")
    print(f"MIN on demand: chunks up per cycle {belady(launches, budget)}")
    for fraction in (1.0, 0.8, 0.6, 0.5):
        ups, pauses = segments(launches, budget, int(budget * fraction))
        print(f"greedy segments capped at {fraction:.1f} of the budget: chunks up per cycle {ups}, pauses {pauses}")


if __name__ == "__main__":
    main()
