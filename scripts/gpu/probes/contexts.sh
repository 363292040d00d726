#!/usr/bin/env bash
# The thirty-seventh session (issue 16): a program that makes CUDA contexts of its own
# (bench/matrix/own_context.cu) in the coverage matrix, plainly and at 2x, 0.7x, 0.5x its peak,
# with this build and with the build before contexts.rs (dist/old/, if there), and the C
# programs of the matrix again (cuda_c_static_runtime, cuda_api_tour: migration now waits
# through contexts.rs). Results: OUT/matrix-contexts.json, OUT/matrix-contexts-before.json, logs.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/contexts.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off
matrix() { timeout 280 python3 bench/transparent_matrix.py --tiermem "$1" --out "$2" --programs "$3" --run-args=--stats; }
matrix "$PWD/dist/tiermem" "$out/matrix-contexts.json" own_contexts,cuda_c_static_runtime,cuda_api_tour 2>&1 \
    | tee "$out/matrix-contexts.log"
if [ -x dist/old/tiermem ]; then
    matrix "$PWD/dist/old/tiermem" "$out/matrix-contexts-before.json" own_contexts 2>&1 | tee "$out/matrix-contexts-before.log"
fi
exit 0
