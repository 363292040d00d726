"""What a run of daemon_transparent.sh says about a cut and a newcomer, in one line: A's losses,
its slowest steps (the cut) and median step, how long B took to fill the HBM it was granted
(from its budget's last rise to 95% of what it came to use of it), and the least peer budget A
had while B ran. Where the run recorded when A's steps ended: A's steps while B ran, its pace
at its share and what the cut cost beyond that pace (below).
Usage: python3 lease_summary.py OUT/summary.json [LABEL]"""
import json
import sys

summary = json.load(open(sys.argv[1]))
label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
steps = summary["step_s_leased"]
rows = summary["budgets"]  # (t, tier, tenant label, budget MiB, used MiB)
b_start, b_end = summary["b_window_s"]


def series(tier, who):
    return [(t, budget, used) for t, row_tier, name, budget, used in rows if row_tier == tier and name == who]


newcomer = series("hbm", "newcomer")
fill_s = None
if newcomer:
    granted = max(budget for _, budget, _ in newcomer)
    since = next(t for t, budget, _ in newcomer if budget == granted)
    wanted = min(granted, max(used for _, _, used in newcomer))
    full = next((t for t, budget, used in newcomer if t >= since and used >= 0.95 * wanted), None)
    fill_s = None if full is None else round(full - since, 2)
def median(values):
    return sorted(values)[len(values) // 2] if values else None


# A's steps while B ran, from the first one slower than 1.5x A's pace alone (the cut's effect):
# its pace at its share is the median of their second half, the cut's cost what the first
# half took beyond that pace.
ends = summary.get("step_end_s_leased") or []
alone = median([s for s, end in zip(steps, ends) if end <= b_start][1:])
during = [s for s, end in zip(steps, ends) if b_start < end <= b_end]
cut = next((i for i, s in enumerate(during) if alone and s > 1.5 * alone), None)
shared = cut_s = None
if cut is not None and len(during) - cut >= 4:
    after = during[cut:]
    shared = median(after[len(after) // 2:])
    cut_s = round(sum(max(0.0, s - shared) for s in after[: len(after) // 2]), 2)
peer_a = [budget for t, budget, _ in series("peer", "train") if b_start <= t <= b_end]
print(json.dumps({
    "run": label,
    "losses_identical": summary["losses_identical"],
    "slowest_steps_s": [round(s, 2) for s in sorted(steps)[-3:]],
    "median_step_s": round(sorted(steps)[len(steps) // 2], 3),
    "newcomer_fill_s": fill_s,
    "steps_while_b_ran_s": [round(s, 2) for s in during],
    "alone_step_s": None if alone is None else round(alone, 3),
    "shared_step_s": None if shared is None else round(shared, 3),
    "cut_cost_s": cut_s,
    "train_peer_budget_min_mib_while_b_ran": min(peer_a) if peer_a else None,
}))
