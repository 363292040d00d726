#!/usr/bin/env bash
# The thirty-seventh session (issue 16), last call: the C programs of the matrix rebuilt over
# bench/matrix/common.cuh (own_contexts, created_pool, vmm_pool), and two more kinds of PyTorch
# programs — a DataLoader with forked workers and pinned batches, a torchrun script run as one
# process (NCCL, DDP) — each plainly and at 2x, 0.7x, 0.5x its peak.
# Results: OUT/matrix-more.json, OUT/matrix-more.log.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/more_programs.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off
timeout 420 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-more.json" \
    --programs own_contexts,created_pool,vmm_pool,dataloader,ddp_one --run-args=--stats 2>&1 | tee "$out/matrix-more.log"
python3 - "$out/matrix-more.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for name, runs in r["programs"].items():
    for label, run in runs.items():
        if run.get("exit") != 0:
            print(name, label, "exit", run.get("exit"), run.get("stderr_tail", "")[-400:])
print("checks", sum(r["checks"].values()), "of", len(r["checks"]), "skipped", r["skipped"])
PY
exit 0
