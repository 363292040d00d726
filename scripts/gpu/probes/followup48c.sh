#!/usr/bin/env bash
# The forty-eighth session, last call: tiermem.torch's GPU tests whole (the training tests now
# share one trainer; gradient checkpointing of both kinds, new), with the wheel at HEAD.
# Usage (on the GPU machine, dist/ built here): followup48c.sh OUT
set -u
out=$1
export TIERMEM_PEERS=off
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/wheels/tiermem-*.whl 2>&1 | tail -2
echo "=== test_torch.py on the GPU ($(date +%T))"
TIERMEM_TEST_BACKEND=cuda timeout 400 python3 -m pytest -q -s python/tests/test_torch.py -p no:cacheprovider > "$out/pytest.log" 2>&1
echo "exit $?"; grep -E "passed|failed|FAILED|^losses" "$out/pytest.log" | tail -16
echo "=== done ($(date +%T))"
