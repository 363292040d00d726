#!/usr/bin/env bash
# The daemon's default sharing (`hbm_sharing = "auto"`) when a job spans two GPUs, on the H200
# pair: two training loops under `tiermem run` on GPU 0 (bench/transparent_train.py, each over
# half of the pool's HBM) take turns; a data-parallel pair (bench/matrix/ddp_pair.py: one job,
# NCCL ranks on GPU 0 and GPU 1) starts while they do, so GPU 0 must go to fair share (a job
# with tenants on another GPU: held on one GPU while it has the turn on the other, it would
# stall on both) and back to turns once the pair has gone. Then DDP_RUNS more pairs, one after
# the other. Every program's results are compared with a plain run's (losses; the pair's digest).
# Writes OUT/plain.json, OUT/ddp_plain.json, OUT/{a,b}.json and .log, OUT/ddp*.json and .log,
# OUT/daemon.log, OUT/status.jsonl.xz and OUT/summary.json.
# Usage: auto_multi_gpu.sh TIERMEM_BIN OUT
set -uo pipefail
BIN=${1:?tiermem binary}; OUT=${2:?output dir}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
. "$(dirname "$0")/daemon_lib.sh"
STEPS=${STEPS:-40}; HBM_POOL=${HBM_POOL:-20GiB}; CAP_S=${CAP_S:-240}; TURN_MS=${TURN_MS:-30000}
DDP_RUNS=${DDP_RUNS:-2}
INPUTS=$(mktemp -d)
trap 'rm -rf "$INPUTS"' EXIT
export TIERMEM_SOCKET="$INPUTS/tiermemd.sock" TIERMEM_PEERS=off

echo "== plain runs (no tiermem): the reference losses and digest"
CUDA_VISIBLE_DEVICES=0 TIERMEM_DAEMON=off python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$OUT/plain.json"
TIERMEM_DAEMON=off python3 "$HERE/bench/matrix/ddp_pair.py" > "$OUT/ddp_plain.json"

printf 'idle_after_ms = 0\nturn_ms = %s\n[[gpu]]\nindex = 0\nhbm = "%s"\n[[gpu]]\nindex = 1\nhbm = "%s"\n' \
  "$TURN_MS" "$HBM_POOL" "$HBM_POOL" > "$INPUTS/tiermemd.toml"
start_daemon "$BIN" "$INPUTS/tiermemd.toml" "$OUT"

train() {  # train NAME: a training loop under tiermem run on GPU 0
  local t0 rc; t0=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=0 timeout -k 20 "$CAP_S" "$BIN" run --label "$1" --hbm-limit "$HBM_POOL" --stats -- \
    python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$OUT/$1.json" 2> "$OUT/$1.log"
  rc=$?; echo "$t0 $(date +%s.%N) $rc" > "$OUT/$1.times"
}
in_turns() {  # whether the daemon's status says GPU 0 is in turns
  "$BIN" status --json --socket "$TIERMEM_SOCKET" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(any(p.get("in_turns", False) for p in d["pools"] if p["tier"] == "hbm" and p["gpu"] == 0))' 2>/dev/null
}

echo "== two training loops on GPU 0, then the pair"
start=$(date +%s.%N)
train a & pa=$!
sleep 2
train b & pb=$!
for _ in $(seq 120); do [ "$(in_turns)" = True ] && break; sleep 0.5; done
echo "GPU 0 in turns: $(in_turns) after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
for run in $(seq "$DDP_RUNS"); do
  t0=$(date +%s.%N)
  timeout -k 20 "$CAP_S" "$BIN" run --label "ddp$run" --hbm-limit "$HBM_POOL" --stats -- \
    python3 "$HERE/bench/matrix/ddp_pair.py" > "$OUT/ddp$run.json" 2> "$OUT/ddp$run.log"
  echo "$t0 $(date +%s.%N) $?" > "$OUT/ddp$run.times"
  echo "pair $run done: GPU 0 in turns: $(in_turns)"
done
for _ in $(seq 20); do [ "$(in_turns)" = True ] && break; sleep 0.5; done
echo "after the pairs, GPU 0 in turns: $(in_turns)"
wait $pa $pb
echo "$start $(date +%s.%N)" > "$OUT/makespan.times"
stop_daemon
grep -h "GPU [01]:" "$OUT/daemon.log" | cut -c1-200

PYTHONPATH="$(dirname "$0")" python3 - "$OUT" "$DDP_RUNS" <<'PY'
import json, lzma, sys
from turns_summary import outcome
out, ddp_runs = sys.argv[1], int(sys.argv[2])
plain = json.load(open(f"{out}/plain.json"))
ddp_plain = json.loads(open(f"{out}/ddp_plain.json").read().strip().splitlines()[-1])
start, end = map(float, open(f"{out}/makespan.times").read().split())
summary = {"makespan_s": round(end - start, 2), "plain_step_s_median": plain.get("step_s_median"),
           "sharing_changes": [l.strip()[:200] for l in open(f"{out}/daemon.log") if "GPU 0:" in l or "GPU 1:" in l]}
for name in ("a", "b"):
    summary[name], _ = outcome(out, name, plain)
for run in range(1, ddp_runs + 1):
    t0, t1, rc = open(f"{out}/ddp{run}.times").read().split()
    lines = open(f"{out}/ddp{run}.json").read().strip().splitlines()
    got = json.loads(lines[-1]) if lines else {}
    summary[f"ddp{run}"] = {"exit": int(rc), "wall_s": round(float(t1) - float(t0), 2),
                            "digest_identical": got.get("digest") == ddp_plain.get("digest"),
                            "pool_registered": got.get("pool_registered")}
# GPU 0's sharing over time, from the status polls: (seconds since start, in turns, tenants)
timeline, last = [], None
for line in lzma.open(f"{out}/status.jsonl.xz", "rt"):
    row = json.loads(line)
    status = row.get("status") or {}
    for pool in status.get("pools", []):
        if pool["tier"] != "hbm" or pool["gpu"] != 0:
            continue
        now = (pool.get("in_turns", False), len(pool["shares"]))
        if now != last:
            timeline.append([round(row["t"] - start, 1), *now])
            last = now
summary["gpu0_in_turns_timeline"] = timeline
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
