#!/usr/bin/env bash
# A program beside an engine under explicit `hbm_sharing = "working-sets"`: an engine tenant
# (`tiermem bench tenant-worker`, linked to the daemon; it cannot wait for a turn: it keeps room
# for twice its largest acquire) working over ENGINE_SET in buffers of ENGINE_BUFFER, and
# bench/transparent_train.py (peak ~17.5 GB) under `tiermem run`, sharing HBM_POOL of GPU 0.
# The program does not fit beside what the engine keeps, and the engine never waits, so the
# program's turn could never come: until e461754's rule ("held only while its turn can come")
# it was held for as long as the engine worked. Now it runs on what it keeps, reading the rest
# in place. The engine stops once the program has ended (or after CAP_S). Writes OUT/plain.json,
# OUT/program.{json,log,times}, OUT/engine.{json,log}, daemon.log, status.jsonl.xz and
# summary.json (the program's steps and losses against the plain run's, the seconds it was
# held, the engine's rounds and mismatched words).
# Usage: engine_beside_program.sh TIERMEM_BIN OUT
set -uo pipefail
BIN=${1:?tiermem binary}; OUT=${2:?output dir}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
. "$(dirname "$0")/daemon_lib.sh"
STEPS=${STEPS:-20}; HBM_POOL=${HBM_POOL:-12GiB}; ENGINE_SET=${ENGINE_SET:-8GiB}
ENGINE_BUFFER=${ENGINE_BUFFER:-2GiB}; TURN_MS=${TURN_MS:-10000}; CAP_S=${CAP_S:-150}
INPUTS=$(mktemp -d)
trap 'rm -rf "$INPUTS"' EXIT
export TIERMEM_SOCKET="$INPUTS/tiermemd.sock" TIERMEM_PEERS=off

echo "== plain run (no tiermem): the reference losses"
TIERMEM_DAEMON=off python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$OUT/plain.json"
printf 'idle_after_ms = 0\nhbm_sharing = "working-sets"\nturn_ms = %s\n[[gpu]]\nindex = 0\nhbm = "%s"\n' \
  "$TURN_MS" "$HBM_POOL" > "$INPUTS/tiermemd.toml"
start_daemon "$BIN" "$INPUTS/tiermemd.toml" "$OUT"
echo "== the engine, then the program"
TIERMEM_DAEMON="$TIERMEM_SOCKET" timeout -k 20 $((CAP_S + 30)) "$BIN" bench tenant-worker \
  --working-set "$ENGINE_SET" --buffer-size "$ENGINE_BUFFER" --stop-file "$INPUTS/stop" \
  > "$OUT/engine.json" 2> "$OUT/engine.log" & engine=$!
sleep 5
t0=$(date +%s.%N)
timeout -k 20 "$CAP_S" "$BIN" run --label program --hbm-limit "$HBM_POOL" --stats -- \
  python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$OUT/program.json" 2> "$OUT/program.log"
echo "$t0 $(date +%s.%N) $?" > "$OUT/program.times"
touch "$INPUTS/stop"; wait $engine; echo "engine exit $?"
stop_daemon

PYTHONPATH="$(dirname "$0")" python3 - "$OUT" <<'PY'
import json, sys
from turns_summary import held_seconds, outcome
out = sys.argv[1]
plain = json.load(open(f"{out}/plain.json"))
program, _ = outcome(out, "program", plain)
program.update(plain_step_s_median=plain.get("step_s_median"), held_s=held_seconds(f"{out}/status.jsonl.xz", "program"))
engine = next((json.loads(l) for l in reversed(open(f"{out}/engine.json").read().splitlines()) if l.startswith("{")), {})
summary = {"program": program, "engine": {k: engine.get(k) for k in ("rounds", "bytes", "seconds", "mismatched_words", "retries")}}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
