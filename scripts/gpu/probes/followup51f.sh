#!/usr/bin/env bash
# The fifty-first session, sixth call: the model zoo (GPT-2, Gemma, Gemma 2, Qwen2, Phi-3, OPT,
# Qwen2-MoE, OLMoE, T5, BERT) on the GPU through a real Pool smaller than each model
# (python/tests/test_torch_zoo_gpu.py: inference, generation, training with activations).
# Usage (GPU machine; dist/ built here): followup51f.sh OUT
set -u
out=$1; mkdir -p "$out"
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" | tee "$out/versions.txt"
cd python/tests && TIERMEM_TEST_BACKEND=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider test_torch_zoo_gpu.py -rfEs --tb=line 2>&1 | tail -60 | tee "$out/zoo-gpu.log"
