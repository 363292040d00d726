#!/usr/bin/env bash
# The twenty-sixth session's first GPU call: homes handed over behind the GPU's work
# (homes.rs, "Handing a home over") against the host waiting for it (TIERMEM_HAND_OVER=off),
# alternating in one call: the MoE and tied decodes of the torch benchmark, bench engine; and
# the engine's schedule tests on the GPU.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/hand_over_ab.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
export TIERMEM_PEERS=off
mkdir -p /tmp/t && tar -C /tmp/t -xJf dist/tests.tar.xz
echo "=== engine schedule tests on the GPU" | tee -a "$log"
TIERMEM_TEST_BACKEND=cuda timeout 120 /tmp/t/tests/engine-schedule > "$out/engine-schedule.txt" 2>&1
grep -E "test result|FAILED|panicked" "$out/engine-schedule.txt" | tee -a "$log"
for i in 1 2; do
  for h in off on; do
    echo "=== MoE, hand over $h, run $i" | tee -a "$log"
    TIERMEM_HAND_OVER=$h timeout 100 python3 bench/torch_bench.py --parts moe --json "$out/moe-$h-$i" --commit "$commit-$h" > "$out/moe-$h-$i.txt" 2>&1
    grep -E "of the PCIe bound" "$out/moe-$h-$i.txt" | tee -a "$log"
    python3 - "$out/moe-$h-$i" <<'PY' | tee -a "$log"
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/*.json"):
    m = json.load(open(f))["metrics"]
    print("  host s/step", m.get("moe_host_seconds_per_step"), "all resident", round(m.get("moe_all_resident_decode_tok_s", 0)))
PY
  done
done
for h in off on; do
  echo "=== tied, hand over $h" | tee -a "$log"
  TIERMEM_HAND_OVER=$h timeout 120 python3 bench/torch_bench.py --parts tied --json "$out/tied-$h" --commit "$commit-$h" --scratch "$PWD" > "$out/tied-$h.txt" 2>&1
  grep -E "of the PCIe bound|wake:|^load" "$out/tied-$h.txt" | tee -a "$log"
done
for h in off on; do
  echo "=== bench engine, hand over $h" | tee -a "$log"
  TIERMEM_HAND_OVER=$h TIERMEM_COMMIT=$commit-$h timeout 90 dist/tiermem bench engine --json "$out/engine-$h" 2>&1 | grep -E "page-in|exchange|loop|advance|verified" | tee -a "$log"
done
tar -C "$out" -cJf "$out/../hand-over-ab.tar.xz" .
