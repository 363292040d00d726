#!/usr/bin/env bash
# The paging-ahead window's share of the cap, A/B/A/B in one call (tiermem.torch.WINDOW_SHARE): the MoE
# and tied decodes at a twelfth and an eighth of the cap.
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/window_share_ab.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/all"; log=$out/all/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl
for run in 1 2; do for share in 12 8; do
  echo "=== run $run, window at most 1/$share of the cap" | tee -a "$log"
  timeout 150 python3 bench/torch_bench.py --json "$out/all" --commit "$commit-r$run" --parts moe,tied --window-share $share \
    --scratch "$PWD" > "$out/all/torch-r$run-$share.log" 2>&1
  grep -E "of the PCIe bound|identical" "$out/all/torch-r$run-$share.log" | tail -6 | tee -a "$log"
done; done
tar -C "$out" -cJf "$out/all.tar.xz" all
