#!/usr/bin/env bash
# The twenty-sixth session's third GPU call: the MoE part of the torch benchmark with the
# Mixtral-depth model and the 12-layer one, three runs, homes handed over (the default).
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/moe_shapes.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
export TIERMEM_PEERS=off
for i in 1 2 3; do
  echo "=== MoE shapes, run $i" | tee -a "$log"
  timeout 170 python3 bench/torch_bench.py --parts moe --moe-shapes mixtral-depth,12-layer --json "$out/moe-$i" --commit "$commit" > "$out/moe-$i.txt" 2>&1
  grep -E "of the PCIe bound|Error|error" "$out/moe-$i.txt" | tee -a "$log"
  python3 - "$out/moe-$i" <<'PY' | tee -a "$log"
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/*.json"):
    d = json.load(open(f)); m = d["metrics"]
    for k in ("moe", "moe_12_layer"):
        print(" ", k, "identical", d["checks"].get(f"{k}_identical"), "traffic", round(m.get(f"{k}_traffic_vs_optimum", 0), 3),
              "tok/s", round(m.get(f"{k}_decode_tok_s", 0)), "bound", round(m.get(f"{k}_pcie_bound_decode_tok_s", 0)),
              "all resident", round(m.get(f"{k}_all_resident_decode_tok_s", 0)), "plain", round(m.get(f"{k}_plain_resident_decode_tok_s", 0)),
              "host", m.get(f"{k}_host_seconds_per_step"))
PY
done
