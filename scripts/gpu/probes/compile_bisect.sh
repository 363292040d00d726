#!/usr/bin/env bash
# Issue 16's open question, narrowed on the thirtieth day (H200): `torch.compile` under
# `tiermem run` at 2x its peak, with every move checked and none made (0 checks), gave losses
# that differ from the plain run's in the last bits of two of twelve steps, while three plain
# runs on the same Inductor cache all gave the plain losses. So the interposition itself, not a
# move, changes something the program's numerics depend on. Each run below changes one thing
# (one Inductor cache for all, warmed by the first run), the losses of each printed:
#   plain, plain again           the program alone (deterministic on a warm cache?)
#   plain, memory dirtied first  reads of memory it never wrote (fresh allocations' contents)?
#   run 2x                       the failing case
#   run 2x, no migration         stage 2 and 3 off (TIERMEM_MIGRATE=off)
#   run, no --hbm-limit          cuMemGetInfo close to the real free memory (less 2 GiB)
#   run 2x, 2 MiB chunks         another address layout of tiermem's allocations
#   plain, Inductor's caches off  compiled and tuned afresh: do kernels chosen by timing them
#                                (autotuning) change the losses from run to run by themselves?
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/compile_bisect.sh OUT [PASSES]
set -u
out=$(realpath -m "$1") passes=${2:-1}
mkdir -p "$out"; log=$out/log.txt
tiermem=$PWD/dist/tiermem
export TIERMEM_STATS=1  # each tiermem run says in OUT/LABEL.err what moved (nothing should, at 2x)
cd bench/matrix
one() {  # LABEL COMMAND...: the run's report in OUT/LABEL.json, its losses in the log
  local label=$1; shift
  { timeout 150 "$@" 2>"$out/$label.err" || true; } | tail -1 > "$out/$label.json"
  echo "$label: $(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('losses'))" "$out/$label.json" 2>&1 | tail -1)" | tee -a "$log"
}
dirty='import torch; x = torch.full((60 << 28,), float("nan"), device="cuda"); del x; torch.cuda.empty_cache(); import runpy; runpy.run_path("compiled.py")'
rm -rf /tmp/torchinductor_$(id -un)
one plain-warming python3 compiled.py
peak=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['peak_bytes'])" "$out/plain-warming.json")
for pass in $(seq "$passes"); do
  one "plain-$pass" python3 compiled.py
  one "plain-dirtied-$pass" python3 -c "$dirty"
  one "run-2x-$pass" "$tiermem" run --hbm-limit $((2 * peak)) -- python3 compiled.py
  TIERMEM_MIGRATE=off one "run-2x-no-migration-$pass" "$tiermem" run --hbm-limit $((2 * peak)) -- python3 compiled.py
  one "run-no-limit-$pass" "$tiermem" run -- python3 compiled.py
  TIERMEM_CHUNK=2MiB one "run-2x-chunk-2MiB-$pass" "$tiermem" run --hbm-limit $((2 * peak)) -- python3 compiled.py
  TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 one "plain-no-caches-$pass" python3 compiled.py
done
echo "=== done ($(date +%T))" | tee -a "$log"
