#!/usr/bin/env bash
# What an allocation that does not fit does to kept async frees, A/B: scripts/gpu/probes/kept_pressure_ab.sh OUT_DIR
# Ran once at cef717e (the setting TIERMEM_KEPT_PRESSURE existed only there): bench/results/probes-20261127b/kept-pressure-cef717e/.
set -u
out=$1; T=$PWD/dist/tiermem; peak=17500000000
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
for frac in 7 5; do for m in all need spill; do
  TIERMEM_KEPT_PRESSURE=$m $T run --hbm-limit $((peak * frac / 10)) --stats -- python3 bench/transparent_train.py --out $out/async-0.$frac-$m.json 2> $out/async-0.$frac-$m.log
  echo "0.$frac $m: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['step_s_median'],3), d['oom'], d['losses'][-1])" $out/async-0.$frac-$m.json 2>&1) $(grep -E 'cycles|async frees' $out/async-0.$frac-$m.log | tr '\n' ' ')"
done; done
