#!/usr/bin/env bash
# The twenty-ninth session (issue 16): torch.compile's losses differed at 0.5x the peak. Whether
# Inductor itself is deterministic across fresh caches, and whether the capped run repeats.
# Usage: scripts/gpu/probes/compile_digest.sh OUT BUDGET_BYTES
set -u
out=$1 budget=$2
tiermem=$PWD/dist/tiermem
cd bench/matrix
one() {  # NAME CACHE [tiermem run args...]
  local name=$1 cache=$2; shift 2
  local started=$(date +%s)
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$cache timeout 170 "$@" python3 compiled.py > "$out/$name.out" 2> "$out/$name.log"
  echo "$name: exit $? in $(( $(date +%s) - started )) s: $(tail -1 "$out/$name.out")" | tee -a "$out/log.txt"
}
one plain-c1 c1 env
one capped-c1 c1 "$tiermem" run --hbm-limit "$budget" --stats --
one plain-c2 c2 env
one capped-c1-again c1 "$tiermem" run --hbm-limit "$budget" --stats --
