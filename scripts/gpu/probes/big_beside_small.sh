#!/usr/bin/env bash
# A program larger than the daemon's pool beside a small one, both under `tiermem run` with the
# daemon's default sharing (`auto`: in turns): bench/transparent_train.py (peak ~17.5 GB) and
# its --small model (a few hundred MiB) sharing HBM_POOL of GPU 0, the small one first. Until
# 32c08c2 the large one, passed over for the small one that fits, was held for as long as the
# small one worked; now they take turns (TURN_MS). Each program's losses are compared with a
# plain run's. Writes OUT/{plain,plain-small}.json, OUT/{big,small}.json and .log, daemon.log,
# status.jsonl.xz (the daemon's status every 0.5 s) and summary.json.
# Usage: big_beside_small.sh TIERMEM_BIN OUT
set -uo pipefail
BIN=${1:?tiermem binary}; OUT=${2:?output dir}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
. "$(dirname "$0")/daemon_lib.sh"
BIG_STEPS=${BIG_STEPS:-20}; SMALL_STEPS=${SMALL_STEPS:-3000}; HBM_POOL=${HBM_POOL:-12GiB}
TURN_MS=${TURN_MS:-10000}; CAP_S=${CAP_S:-150}
INPUTS=$(mktemp -d)
trap 'rm -rf "$INPUTS"' EXIT
export TIERMEM_SOCKET="$INPUTS/tiermemd.sock" TIERMEM_PEERS=off
train() {  # train NAME ARGS...: one program under tiermem run
  local name=$1 t0 rc; shift; t0=$(date +%s.%N)
  timeout -k 20 "$CAP_S" "$BIN" run --label "$name" --hbm-limit "$HBM_POOL" --stats -- \
    python3 "$HERE/bench/transparent_train.py" --out "$OUT/$name.json" "$@" 2> "$OUT/$name.log"
  rc=$?; echo "$t0 $(date +%s.%N) $rc" > "$OUT/$name.times"
}

echo "== plain runs (no tiermem): the reference losses"
TIERMEM_DAEMON=off python3 "$HERE/bench/transparent_train.py" --steps "$BIG_STEPS" --out "$OUT/plain.json"
TIERMEM_DAEMON=off python3 "$HERE/bench/transparent_train.py" --small --steps "$SMALL_STEPS" --out "$OUT/plain-small.json"
printf 'idle_after_ms = 0\nturn_ms = %s\n[[gpu]]\nindex = 0\nhbm = "%s"\n' "$TURN_MS" "$HBM_POOL" > "$INPUTS/tiermemd.toml"
start_daemon "$BIN" "$INPUTS/tiermemd.toml" "$OUT"
echo "== the small program, then the large one"
start=$(date +%s.%N)
train small --small --steps "$SMALL_STEPS" & ps=$!
sleep 3
train big --steps "$BIG_STEPS" & pb=$!
wait $ps $pb
echo "$start $(date +%s.%N)" > "$OUT/makespan.times"
stop_daemon
grep -h "waited for turns" "$OUT/small.log" "$OUT/big.log" | cut -c1-250

PYTHONPATH="$(dirname "$0")" python3 - "$OUT" <<'PY'
import json, sys
from turns_summary import held_timeline, outcome
out = sys.argv[1]
start, end = map(float, open(f"{out}/makespan.times").read().split())
summary = {"makespan_s": round(end - start, 2)}
for name, plain in (("small", "plain-small"), ("big", "plain")):
    ref = json.load(open(f"{out}/{plain}.json"))
    summary[name], _ = outcome(out, name, ref)
    summary[name]["plain_step_s_median"] = ref.get("step_s_median")
summary["held_timeline"] = held_timeline(f"{out}/status.jsonl.xz", start)
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
