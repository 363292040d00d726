#!/usr/bin/env bash
# The forty-second session's first GPU call (issue 16), on two GPUs: NCCL registering tiermem's
# own memory. bench/matrix/ddp_pair.py registers a pool of PyTorch's default allocator (under
# `tiermem run`, tiermem's memory) besides one of NCCL's own allocator (the forty-first session's
# run showed only the latter). The matrix's ddp_pair plain and at 2x, 0.7x, 0.5x its peak, then
# once at 0.7x with NCCL's registration log (NCCL_DEBUG_SUBSYS=REG).
# Results under OUT. Usage (on the GPU machine, after building dist/ here): followup42a.sh OUT
set -u
out=$1
mkdir -p "$out"
export TIERMEM_PEERS=off
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
timeout 240 python3 bench/transparent_matrix.py --tiermem "$PWD/dist/tiermem" --out "$out/matrix-ddp-pair.json" \
  --programs ddp_pair --run-args=--stats 2>&1 | tail -8
peak=$(python3 -c "import json;print(json.load(open('$out/matrix-ddp-pair.json'))['programs']['ddp_pair']['plain']['report']['peak_bytes'])" 2>/dev/null)
if [ -n "$peak" ]; then
  (cd bench/matrix && NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG timeout 120 "$OLDPWD/dist/tiermem" run --stats \
     --hbm-limit $((peak * 7 / 10)) -- python3 ddp_pair.py) > "$out/ddp-pair-nccl-reg.log" 2>&1
  echo "nccl log: exit $?"; grep -ci "regist" "$out/ddp-pair-nccl-reg.log"
  grep -i "regist\|error\|warn" "$out/ddp-pair-nccl-reg.log" | sed 's/^[^ ]* [^ ]* //' | sort | uniq -c | sort -rn | head -16 | cut -c1-300
  tail -3 "$out/ddp-pair-nccl-reg.log" | cut -c1-600
  xz -9 "$out/ddp-pair-nccl-reg.log"
fi
python3 - "$out/matrix-ddp-pair.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print("checks", m.get("checks"), "skipped", m.get("skipped"))
for run, v in m.get("programs", {}).get("ddp_pair", {}).items():
    r = v.get("report", {})
    print(run, "exit", v.get("exit"), "pool_registered", r.get("pool_registered"), "nccl_pool_registered",
          r.get("nccl_pool_registered"), "graph", r.get("graph_captured"), "step_s", r.get("step_s"))
PY
exit 0
