#!/usr/bin/env bash
# Builds, on the development machine, everything the GPU run needs into dist/ (git-ignored):
# the release `tiermem` binary, the GPU-capable test binaries and fio. Binaries built here run there.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf dist && mkdir -p dist/tests
cargo build --release -p tiermem-cli -p tiermem-preload
cp target/release/tiermem target/release/libtiermem_preload.so dist/
# Test binaries, named after their crate and target (no failpoints: those are simulated-device tests).
cargo test --release --no-run -p tiermem -p tiermem-mechanism --message-format=json \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    package = "mechanism" if "tiermem-mechanism" in m["package_id"] else "engine"
    name = package + "-" + m["target"]["name"].replace("tiermem_mechanism", "unit").replace("tiermem", "unit")
    shutil.copy(m["executable"], "dist/tests/" + name)
    print("dist/tests/" + name)
'
strip dist/tiermem dist/libtiermem_preload.so dist/tests/*
# The test binaries travel compressed: with them plain, dist/ outgrows what a run may carry (64 MiB).
tar -C dist -cJf dist/tests.tar.xz tests && rm -r dist/tests
# fio for `bench swap` (the GPU machine has none): static, cached outside the repository.
scripts/gpu/fio/build.sh dist || echo "WARNING: no fio in dist/: bench swap will record its device measurements as missing"
# The Python wheel (abi3: loads on the GPU machine's Python 3.12) and pytest, which that
# machine may lack and cannot download.
python3 -m pip wheel -q --no-deps -w dist/wheels .
python3 -m pip download -q -d dist/wheels pytest
du -sh dist
