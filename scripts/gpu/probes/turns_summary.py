"""What the turn probes (turns_transparent.sh, big_beside_small.sh, auto_multi_gpu.sh,
engine_beside_program.sh) say of each program they ran under `tiermem run` beside the node
daemon, and of who the daemon held: read by their summaries (`PYTHONPATH` the probes' folder)."""
import json
import lzma
import os


def outcome(folder, name, plain):
    """A program's run, NAME.times ("start end exit"), NAME.json (the training loop's report)
    and NAME.log (its stderr) in `folder`, against `plain`, a plain run's report: its row of
    the summary, and its report."""
    t0, t1, rc = open(f"{folder}/{name}.times").read().split()
    path = f"{folder}/{name}.json"
    run = json.load(open(path)) if os.path.exists(path) else {}
    losses = run.get("losses", [])
    said = [line.strip() for line in open(f"{folder}/{name}.log") if "waited for turns" in line]
    row = {"exit": int(rc), "wall_s": round(float(t1) - float(t0), 2), "steps": len(losses),
           "losses_identical": bool(losses) and losses == plain["losses"][: len(losses)],
           "step_s_median": run.get("step_s_median"), "turns": said[-1].split("; ")[-1] if said else None}
    return row, run


def polls(path):
    """Each status poll of `path` (status.jsonl.xz): its unix time and the tenants held then
    (by label, else name), sorted."""
    for line in lzma.open(path, "rt"):
        row = json.loads(line)
        tenants = (row.get("status") or {}).get("tenants", [])
        yield row["t"], sorted(t.get("label") or t.get("name") for t in tenants if t.get("held"))


def held_timeline(path, start):
    """Who was held, at each change: [seconds since `start`, held]."""
    changes, last = [], None
    for t, held in polls(path):
        if held != last:
            changes.append([round(t - start, 1), held])
            last = held
    return changes


def held_seconds(path, label):
    """The seconds the tenant labelled `label` was held, poll to poll."""
    total, last = 0.0, None
    for t, held in polls(path):
        if last is not None and label in last[1]:
            total += t - last[0]
        last = (t, held)
    return round(total, 1)
