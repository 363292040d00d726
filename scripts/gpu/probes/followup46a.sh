#!/usr/bin/env bash
# The forty-sixth session's first GPU call: the engine's targets after Engine::summary
# (bench engine, the torch benchmark), and the two turn rules that had run only in CI:
# a newcomer beside two programs in turns (turns_transparent.sh, auto, c 40 s after a and b)
# and a program beside an engine under explicit working-sets (engine_beside_program.sh).
# Usage (on the GPU machine, dist/ built here): followup46a.sh OUT COMMIT
set -u
out=$1 commit=$2
mkdir -p "$out/results"
export TIERMEM_PEERS=off
nvidia-smi -L
python3 -m pip install -q --no-index --no-deps dist/wheels/tiermem-*.whl 2>&1 | tail -2
echo "=== bench engine ($(date +%T))"
TIERMEM_COMMIT=$commit timeout 120 dist/tiermem bench engine --json "$out/results" 2>&1 | tail -14
echo "=== torch benchmark ($(date +%T))"
mkdir -p gpu-scratch
timeout 200 python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$PWD/gpu-scratch" > "$out/torch.log" 2>&1
echo "exit $?"; tail -25 "$out/torch.log"
echo "=== a newcomer beside two in turns ($(date +%T))"
MODES=auto PROGRAMS="a b c" DELAYS="0 0 40" STEPS=200 CAP_S=320 timeout 340 \
  scripts/gpu/probes/turns_transparent.sh "$PWD/dist/tiermem" "$out/newcomer" 2>&1 | tail -60
echo "=== a program beside an engine, working-sets ($(date +%T))"
timeout 200 scripts/gpu/probes/engine_beside_program.sh "$PWD/dist/tiermem" "$out/beside-engine" 2>&1 | tail -30
echo "=== done ($(date +%T))"
exit 0
