#!/usr/bin/env bash
# Two programs under `tiermem run` sharing one GPU through the node daemon, each over half of
# its HBM: bench/transparent_train.py twice (peak ~17.5 GB each; the daemon shares HBM_POOL of
# GPU 0, host memory beyond). Three ways (MODES):
#   serial       one after the other, each alone with the daemon (the baseline);
#   fair         both at once, fair share (each gets half and reads the rest in place);
#   working-sets both at once, whole working sets in turns (turn_ms TURN_MS), the program
#                waiting for its turn held (its launches wait: the daemon's turns.rs);
#   working-sets-nohold  the same with TIERMEM_WAIT_FOR_TURNS=off: the waiting program runs on
#                what it keeps, reading the rest in place (as before the hold).
#   auto         the daemon's default sharing (hbm_sharing left out): programs under tiermem
#                run, each of its own job, take turns as with working-sets.
# PROGRAMS names the programs (default "a b"; "a b c" for three); DELAYS the seconds after the
# first that each starts (default 2 s apart; "0 0 40": a newcomer beside two in turns); TRACE=1 writes each program's
# TIERMEM_TRACE to MODE/NAME.trace.jsonl.xz (its first line's unix_s lines them up). Each program's run is capped
# at CAP_S (SIGTERM: the training loop writes the steps it made). Writes OUT/plain.json (the
# reference losses), OUT/MODE/NAME.json and .log, daemon.log, status.jsonl, and OUT/summary.json.
# Usage: turns_transparent.sh TIERMEM_BIN OUT
set -uo pipefail
BIN=${1:?tiermem binary}; OUT=${2:?output dir}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
STEPS=${STEPS:-60}; HBM_POOL=${HBM_POOL:-20GiB}; CAP_S=${CAP_S:-200}; TURN_MS=${TURN_MS:-10000}
MODES=${MODES:-serial working-sets working-sets-nohold fair}
PROGRAMS=${PROGRAMS:-a b}
read -ra delays <<< "${DELAYS:-$(seq -s ' ' 0 2 $((2 * ($(wc -w <<< "$PROGRAMS") - 1))))}"
INPUTS=$(mktemp -d)
trap 'rm -rf "$INPUTS"' EXIT
export TIERMEM_SOCKET="$INPUTS/tiermemd.sock" TIERMEM_PEERS=off
train() {  # train NAME DIR: one program under tiermem run, its start and end times in DIR/NAME.times
  local t0 rc trace=(); t0=$(date +%s.%N)
  [ -n "${TRACE:-}" ] && trace=(env "TIERMEM_TRACE=$2/$1.trace.jsonl")
  timeout -k 20 "$CAP_S" "${trace[@]}" "$BIN" run --label "$1" --hbm-limit "$HBM_POOL" --stats -- \
    python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$2/$1.json" 2> "$2/$1.log"
  rc=$?
  echo "$t0 $(date +%s.%N) $rc" > "$2/$1.times"
}

echo "== plain (no tiermem), the reference losses"
TIERMEM_DAEMON=off python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$OUT/plain.json"
for mode in $MODES; do
  dir="$OUT/$mode"; mkdir -p "$dir"
  sharing='hbm_sharing = "fair"'; [ "${mode#working-sets}" != "$mode" ] && sharing='hbm_sharing = "working-sets"'
  [ "$mode" = auto ] && sharing="# hbm_sharing: the default (auto)"
  if [ "$mode" = working-sets-nohold ]; then export TIERMEM_WAIT_FOR_TURNS=off; else unset TIERMEM_WAIT_FOR_TURNS; fi
  printf 'idle_after_ms = 0\n%s\nturn_ms = %s\n[[gpu]]\nindex = 0\nhbm = "%s"\n' \
    "$sharing" "$TURN_MS" "$HBM_POOL" > "$INPUTS/tiermemd.toml"
  rm -f "$TIERMEM_SOCKET"
  "$BIN" daemon --config "$INPUTS/tiermemd.toml" --socket "$TIERMEM_SOCKET" 2> "$dir/daemon.log" &
  daemon=$!
  sleep 1
  ( while kill -0 $daemon 2>/dev/null; do
      printf '{"t": %s, "status": %s}\n' "$(date +%s.%N)" "$("$BIN" status --json --socket "$TIERMEM_SOCKET" 2>/dev/null | tr -d '\n' || echo null)"
      sleep 0.5
    done > "$dir/status.jsonl" ) &
  poll=$!
  echo "== $mode"
  start=$(date +%s.%N)
  if [ "$mode" = serial ]; then
    for name in $PROGRAMS; do train "$name" "$dir"; done
  else
    pids=()
    for name in $PROGRAMS; do
      ( sleep "${delays[${#pids[@]}]:-0}"; train "$name" "$dir" ) & pids+=($!)
    done
    wait "${pids[@]}"
  fi
  echo "$start $(date +%s.%N)" > "$dir/makespan.times"
  kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; kill $poll 2>/dev/null
  for name in $PROGRAMS; do grep -h "waited for turns\|leased from" "$dir/$name.log" | cut -c1-250; done
  xz -9 "$dir/status.jsonl"
  for trace in "$dir"/*.trace.jsonl; do [ -e "$trace" ] && xz -9 "$trace"; done
done

PYTHONPATH="$(dirname "$0")" python3 - "$OUT" "$PROGRAMS" $MODES <<'PY'
import json, sys
from turns_summary import held_timeline, outcome
out, programs, modes = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
plain = json.load(open(f"{out}/plain.json"))
summary = {"plain_step_s_median": plain.get("step_s_median"), "steps": len(plain["losses"])}
for mode in modes:
    d = f"{out}/{mode}"
    start, end = map(float, open(f"{d}/makespan.times").read().split())
    row = {"makespan_s": round(end - start, 2)}
    for name in programs:
        row[name], run = outcome(d, name, plain)
        row[name].update(stopped=run.get("stopped", False), step_s_max=max(run.get("step_s") or [0]))
    row["held_timeline"] = held_timeline(f"{d}/status.jsonl.xz", start)
    summary[mode] = row
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
