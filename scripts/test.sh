#!/usr/bin/env bash
# The whole test suite: the Rust workspace, then the Python package built as a wheel and
# tested with pytest (on the simulated device where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
# cuda.h of CUDA 12.9 and 13.0, for the check that every driver function tiermem exports,
# calls or fakes has the header's signature (crates/preload/tests/signatures.rs); required
# once they could be downloaded.
if [ -z "${TIERMEM_CUDA_H:-}" ]; then
  TIERMEM_CUDA_H=$(scripts/cuda_headers.sh)
  export TIERMEM_CUDA_H
  if [ -n "$TIERMEM_CUDA_H" ]; then export TIERMEM_REQUIRE_CUDA_H=1; fi
fi
cargo test --workspace --all-features
# (--all-features includes `shuttle`: the model checks of the engine's threads,
# crates/engine/src/model_checks.rs, run among the engine's unit tests.)
# A short soak on the simulated device: threads, streams, kernels, every tier, every byte verified.
cargo run --release --bin tiermem -- soak --seconds 20 --threads 3
# Again on a simulated node of three GPUs: the peer tier (neighbours' HBM) as a fourth tier,
# with reads where the chunks lie in a neighbour's HBM (in place).
TIERMEM_SIM_GPUS=3 TIERMEM_PEER_IN_PLACE=on cargo run --release --bin tiermem -- soak --seconds 20 --threads 3 --seed 2
python3 -m pip install --quiet --root-user-action=ignore maturin pytest numpy
python3 -m pip install --quiet --root-user-action=ignore .
python3 -m pytest -q python/tests
