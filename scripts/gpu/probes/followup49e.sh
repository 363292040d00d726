#!/usr/bin/env bash
# The forty-ninth session, a last check of dirty-only hand-overs: the schedule tests on the GPU,
# the tenant worker (2 ms of host work and none) and the training profile once.
# Usage (GPU machine; dist/ built here): followup49e.sh OUT
set -u
out=$1; mkdir -p "$out"; log=$out/summary.txt
export TIERMEM_PEERS=off
TIERMEM_TEST_BACKEND=cuda timeout 120 dist/tests/schedule > "$out/test-schedule.log" 2>&1
echo "test schedule exit $? $(grep 'test result' "$out/test-schedule.log")" | tee -a "$log"
ws=$((8 * 1024 * 6 / 10))MiB
brief='import json,sys; v=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("s=%.3f in=%.2fGB evict_wait=%.0f bad=%s" % (v["seconds"], v["paged_in_bytes"]/1e9, v["evict_wait_ms"], v["mismatched_words"]))'
for think in 2 0; do
  line=$(TIERMEM_DAEMON=off TIERMEM_HBM_LIMIT=2730MiB timeout 60 dist/tiermem bench tenant-worker --working-set $ws --buffer-size 128MiB --rounds 20 --think-ms $think | tail -1)
  echo "$line" > "$out/worker-$think.json"
  echo "worker think=$think $(echo "$line" | python3 -c "$brief")" | tee -a "$log"
done
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
timeout 150 python3 scripts/gpu/probes/train_profile.py --steps 7 > "$out/train.json" 2> "$out/train.log"
echo "train exit $? $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['step_s'],3), {k: round(d['median']['forward'][k],3) for k in ('s','evict_wait_ms','stall_ms')})" "$out/train.json")" | tee -a "$log"
