#!/usr/bin/env bash
# The thirty-eighth session (issue 16): programs whose kernels run in CUDA graphs
# (bench/matrix/graph_serving.py: a captured decoder replayed beside eager kernels, a
# synchronization per step; compiled_graphs.py: torch.compile's reduce-overhead mode;
# cuda_graph.py: replays without synchronizing) at 2x, 0.7x, 0.5x their peak, with this build
# (dist/) and, if there, the build before graph hotness (dist/base/, e.g. 5d84755's).
# The matrix's JSON has each run's step_s (the programs' median step) and --stats lines.
# Results: OUT/matrix-graphs.json, OUT/matrix-graphs-base.json, logs.
# Usage (on the GPU machine, after building dist/ here): scripts/gpu/probes/graphs.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off
matrix() { timeout 250 python3 bench/transparent_matrix.py --tiermem "$1" --out "$2" --programs "$3" --run-args=--stats; }
programs=${GRAPH_PROGRAMS:-graph_serving,compiled_graphs,cuda_graph_replay}
if [ -x dist/base/tiermem ]; then
    matrix "$PWD/dist/base/tiermem" "$out/matrix-graphs-base.json" "$programs" 2>&1 | tee "$out/matrix-graphs-base.log"
fi
if [ -z "${BASE_ONLY:-}" ]; then
    matrix "$PWD/dist/tiermem" "$out/matrix-graphs.json" "$programs" 2>&1 | tee "$out/matrix-graphs.log"
fi
exit 0
