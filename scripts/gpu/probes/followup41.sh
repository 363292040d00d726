#!/usr/bin/env bash
# The forty-first session's GPU call (issue 16), on two GPUs where lent:
#  1. NCCL taking the physical memory of tiermem's buffers, with cuMemRetainAllocationHandle
#     refused for them (0f2ac7f; CI-only before): the coverage matrix's ddp_pair (two processes,
#     DDP, an all-reduce captured in a CUDA graph, a memory pool registered with NCCL) plain and at
#     2x, 0.7x, 0.5x its peak; then once at 0.7x with NCCL's registration log (NCCL_DEBUG_SUBSYS=REG).
#  2. `bench transparent --matrix none` host-only at this build (stage 3 on trial, default).
#  3. policies.py on the decoder: auto with and without the trial, hotness (the trial's gain).
# Results under OUT. Usage (on the GPU machine, after building dist/ here): followup41.sh OUT
set -u
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export TIERMEM_PEERS=off
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
timeout 200 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-ddp-pair.json" \
  --programs ddp_pair --run-args=--stats 2>&1 | tail -8
peak=$(python3 -c "import json;print(json.load(open('$out/matrix-ddp-pair.json'))['programs']['ddp_pair']['plain']['report']['peak_bytes'])" 2>/dev/null)
if [ -n "$peak" ]; then
  (cd bench/matrix && NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG timeout 90 "$OLDPWD/dist/tiermem" run \
     --hbm-limit $((peak * 7 / 10)) -- python3 ddp_pair.py) > "$out/ddp-pair-nccl-reg.log" 2>&1
  echo "nccl log: exit $?"; grep -ci "regist" "$out/ddp-pair-nccl-reg.log"; grep -i "regist\|error\|warn" "$out/ddp-pair-nccl-reg.log" | sort | uniq -c | sort -rn | head -12 | cut -c1-300
  tail -1 "$out/ddp-pair-nccl-reg.log" | cut -c1-300
fi
export POLICY_JOBS=hf_decode
timeout 150 python3 "$here/policies.py" "$PWD/dist/tiermem" "$out" 2>&1 | cut -c1-500
timeout 300 ./dist/tiermem bench transparent --json "$out" --matrix none > "$out/transparent.log" 2>&1
echo "bench transparent: exit $?"; grep -A6 '"ratios"' "$out"/transparent-*.json | grep -v detail | head -8
exit 0
