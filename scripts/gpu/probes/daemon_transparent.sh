#!/usr/bin/env bash
# Issue 16 on the GPU: a program under `tiermem run` leases its budget from the node daemon.
# A (bench/transparent_train.py, label "train", --hbm-limit 20GiB: alone it fits) trains; a few
# seconds after it holds its full size B (a second `tiermem run`, label "newcomer", --hbm-limit 12GiB) arrives and works
# on 8 GiB of its own for a while, then leaves. The daemon shares GPU 0's 20 GiB: A must shed to
# its share while B runs (its steps slow, its losses do not change) and grow back after.
# Writes to OUT: plain.json / leased.json (A's losses and step times), newcomer.log,
# train.log, status.jsonl (`tiermem status --json` every 0.5 s), daemon.log, summary.json.
# With PEER_POOL set (e.g. PEER_POOL=6GiB HBM_POOL=12GiB A_FULL_GIB=11, on two GPUs): the daemon
# also shares neighbours' HBM, A and B run with `--peers 1` (what does not fit GPU 0's share goes
# to GPU 1 within their peer budgets), and after B leaves a plain process takes all but 2 GiB of
# GPU 1 for 10 s (SQUEEZE_S), below the lenders' reserve: A gives GPU 1 back at its next
# synchronizations. summary.json then has the peer budgets too.
# Usage: daemon_transparent.sh TIERMEM_BIN OUT
set -uo pipefail
BIN=${1:?tiermem binary}; OUT=${2:?output dir}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
STEPS=${STEPS:-60}
INPUTS=$(mktemp -d)  # the config and the socket stay out of OUT
trap 'rm -rf "$INPUTS"' EXIT
export TIERMEM_SOCKET="$INPUTS/tiermemd.sock"
HBM_POOL=${HBM_POOL:-20GiB}; PEER_POOL=${PEER_POOL:-}
PEERS_ARGS=(); [ -n "$PEER_POOL" ] && PEERS_ARGS=(--peers 1)
{ echo "idle_after_ms = 0"
  [ -n "$PEER_POOL" ] && printf '[tiers]\npeer = "%s"\n' "$PEER_POOL"
  printf '[[gpu]]\nindex = 0\nhbm = "%s"\n' "$HBM_POOL"; } > "$INPUTS/tiermemd.toml"

echo "== A plain (no tiermem)"
TIERMEM_DAEMON=off python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$OUT/plain.json"

"$BIN" daemon --config "$INPUTS/tiermemd.toml" --socket "$TIERMEM_SOCKET" 2> "$OUT/daemon.log" &
DAEMON=$!
sleep 1
( while kill -0 $DAEMON 2>/dev/null; do
    printf '{"t": %s, "status": %s}\n' "$(date +%s.%N)" "$("$BIN" status --json --socket "$TIERMEM_SOCKET" 2>/dev/null | tr -d '\n' || echo null)"
    sleep 0.5
  done > "$OUT/status.jsonl" ) &
POLL=$!

echo "== A under tiermem run with the daemon, B arriving mid-run"
START=$(date +%s.%N)
# A_ENV: more environment for A alone (TIERMEM_TRACE=FILE for its timeline).
env ${A_ENV:-} "$BIN" run --label train --hbm-limit "$HBM_POOL" "${PEERS_ARGS[@]}" --stats -- \
  python3 "$HERE/bench/transparent_train.py" --steps "$STEPS" --out "$OUT/leased.json" 2> "$OUT/train.log" &
TRAIN=$!
# B arrives once A is training at full size (its HBM in use past A_FULL_GIB), B_AFTER s later.
for _ in $(seq 600); do
  "$BIN" status --json --socket "$TIERMEM_SOCKET" 2>/dev/null | python3 -c '
import json, sys
pools = json.load(sys.stdin).get("pools", [])
sys.exit(0 if any(s["used"] > '"${A_FULL_GIB:-15}"' << 30 for p in pools if p["tier"] == "hbm" for s in p["shares"]) else 1)' && break
  sleep 0.2
done
sleep "${B_AFTER:-3}"
B_START=$(date +%s.%N)
"$BIN" run --label newcomer --hbm-limit 12GiB "${PEERS_ARGS[@]}" --stats -- \
  python3 "$HERE/scripts/gpu/probes/hammer.py" "${B_SECONDS:-15}" 8 newcomer > "$OUT/newcomer.log" 2>&1
B_RC=$?
B_END=$(date +%s.%N)
if [ -n "$PEER_POOL" ] && kill -0 $TRAIN 2>/dev/null; then
  echo "== GPU 1 squeezed below the lenders' reserve for ${SQUEEZE_S:-10} s"
  TIERMEM_DAEMON=off python3 -c '
import sys, time, torch
free = torch.cuda.mem_get_info(1)[0]
x = torch.empty(free - (2 << 30), dtype=torch.uint8, device="cuda:1")
print(f"squeeze: took {x.numel() >> 20} MiB of GPU 1", flush=True)
time.sleep(float(sys.argv[1]))' "${SQUEEZE_S:-10}" > "$OUT/squeeze.log" 2>&1
fi
wait $TRAIN; A_RC=$?
kill $DAEMON; wait $DAEMON 2>/dev/null; kill $POLL 2>/dev/null
tail -5 "$OUT/train.log"; cat "$OUT/newcomer.log"

python3 - "$OUT" "$START" "$B_START" "$B_END" "$A_RC" "$B_RC" <<'EOF'
import json, sys
out, start, b_start, b_end, a_rc, b_rc = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5]), int(sys.argv[6])
plain, leased = (json.load(open(f"{out}/{n}.json")) for n in ("plain", "leased"))
budgets = []  # (t, tenant label, hbm budget) from the status polls
for line in open(f"{out}/status.jsonl"):
    row = json.loads(line)
    status = row["status"] or {}
    labels = {t["tenant"]: t.get("label") or t["name"] for t in status.get("tenants", [])}
    for pool in status.get("pools", []):
        if pool["tier"] in ("hbm", "peer"):
            for s in pool["shares"]:
                budgets.append((round(row["t"] - start, 2), pool["tier"], labels.get(s["tenant"]), s["budget"] >> 20, s["used"] >> 20))
summary = {
    "losses_identical": plain["losses"] == leased["losses"],
    "a_exit": a_rc, "b_exit": b_rc,
    "b_window_s": [round(b_start - start, 2), round(b_end - start, 2)],
    "step_s_plain": plain["step_s"], "step_s_leased": leased["step_s"],
    "step_end_s_leased": [round(t - start, 2) for t in leased.get("step_end_unix", [])],
    "budgets": budgets[:: max(1, len(budgets) // 200)],
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps({k: v for k, v in summary.items() if k not in ("budgets", "step_s_plain", "step_s_leased", "step_end_s_leased")}))
EOF
