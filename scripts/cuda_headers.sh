#!/usr/bin/env bash
# Prints the include folders of CUDA 12.9's and 13.0's cuda.h, separated by ':', for
# crates/preload/tests/signatures.rs (TIERMEM_CUDA_H): taken from PyPI's nvidia-cuda-runtime
# wheels (headers only; nothing is installed) into target/cuda-headers/, once. Prints nothing,
# and says why on stderr, when they cannot be had (no network).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=target/cuda-headers
wheels=("nvidia-cuda-runtime-cu12==12.9.79:nvidia/cuda_runtime/include" "nvidia-cuda-runtime==13.0.96:nvidia/cu13/include")
found=()
for pair in "${wheels[@]}"; do
  spec=${pair%%:*} inside=${pair#*:}
  into="$dir/${spec//[=]/-}"
  if [ ! -f "$into/$inside/cuda.h" ]; then
    mkdir -p "$into"
    if ! python3 -m pip download --quiet --no-deps --dest "$into" "$spec" >/dev/null 2>&1; then
      echo "cuda_headers: could not download $spec: the signature check will not run" >&2
      continue
    fi
    python3 - "$into" "$inside" <<'PY' || continue
import glob, sys, zipfile
into, inside = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(f"{into}/*.whl")[0]) as wheel:
    wheel.extractall(into, [n for n in wheel.namelist() if n.startswith(inside + "/") and n.endswith(".h")])
PY
  fi
  found+=("$PWD/$into/$inside")
done
(IFS=:; echo "${found[*]}")
