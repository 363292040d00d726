#!/usr/bin/env bash
# Whether the real libcuda gives any two of the driver names the preload knows one address
# (the case routes.rs tells apart by what was asked), and a short run of bench transparent's
# training loop under `tiermem run` at 0.7x its peak against a plain run: losses identical.
# Usage (on the GPU machine, dist/ built here): routing_real.sh OUT
set -u
out=$1; mkdir -p "$out"
export TIERMEM_PEERS=off TIERMEM_DAEMON=off
grep -ohE '\bcu[A-Z][A-Za-z0-9_]*' crates/preload/src/*.rs | sort -u > "$out/names.txt"
python3 - "$out/names.txt" <<'PY' | tee "$out/aliases.txt"
import ctypes, collections, sys
cuda = ctypes.CDLL("libcuda.so.1")
dlsym = ctypes.CDLL(None).dlsym
dlsym.restype, dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
names = open(sys.argv[1]).read().split()
at = collections.defaultdict(list)
for n in names:
    a = dlsym(cuda._handle, n.encode())
    if a:
        at[a].append(n)
shared = {hex(a): ns for a, ns in at.items() if len(ns) > 1}
print(f"{len(names)} names, {sum(map(len, at.values()))} in libcuda, at {len(at)} addresses; shared: {shared or 'none'}")
PY
steps=8
python3 bench/transparent_train.py --steps $steps --out "$out/plain.json" > /dev/null 2>&1
peak=$(python3 -c "import json;print(json.load(open('$out/plain.json'))['max_memory_reserved'])")
timeout 200 dist/tiermem run --stats --hbm-limit $((peak * 7 / 10)) -- python3 bench/transparent_train.py --steps $steps \
  --out "$out/capped.json" 2> "$out/capped.log"
echo "capped exit $?"; grep "stats" "$out/capped.log" | cut -c1-200 | head -5
python3 - "$out" <<'PY'
import json, sys
p, c = (json.load(open(f"{sys.argv[1]}/{n}.json")) for n in ("plain", "capped"))
print("losses identical:", p["losses"] == c["losses"], len(c["losses"]), "steps; step s plain", round(p["step_s_median"], 3), "capped", round(c["step_s_median"], 3))
PY
