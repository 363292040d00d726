#!/usr/bin/env bash
# A/B in one call of tiermem.torch's Python side: OLD (python/tiermem of an earlier commit,
# in dist/old/tiermem, over the installed extension module) against the installed wheel.
# The hooks' host time (hook_time.py), then the MoE and tied decodes, alternating.
# Usage (on the GPU machine, after scripts/gpu/build.sh and dist/old/tiermem filled here):
#   scripts/gpu/probes/hooks_ab.sh OUT OLD_COMMIT NEW_COMMIT
set -u
out=$1 old=$2 new=$3
mkdir -p "$out"; log=$out/log.txt
python3 -m pip install -q --no-index --no-deps dist/wheels/*.whl
site=$(python3 -c "import tiermem, os; print(os.path.dirname(tiermem.__file__))")
mkdir -p /tmp/old && cp -r dist/old/tiermem /tmp/old/ && cp "$site"/_tiermem*.so /tmp/old/tiermem/
export TIERMEM_PEERS=off
run() {  # run NAME PYTHONPATH COMMAND...
  local name=$1 path=$2; shift 2
  echo "=== $name" | tee -a "$log"
  PYTHONPATH=$path "$@" 2>&1 | grep -v -i warn > "$out/$name.txt"
}
run hooks-old /tmp/old timeout 120 python3 scripts/gpu/probes/hook_time.py "$out/hooks-old"
run hooks-new "" timeout 120 python3 scripts/gpu/probes/hook_time.py "$out/hooks-new"
grep -h -E "tok/s|us a site" "$out"/hooks-*/hook-time.txt | tee -a "$log"
for i in 1 2; do
  for v in old new; do
    path=$([ $v = old ] && echo /tmp/old || echo "")
    c=$([ $v = old ] && echo "$old" || echo "$new")
    run "bench-$v-$i" "$path" timeout 120 python3 bench/torch_bench.py --parts moe,tied --json "$out/bench-$v-$i" --commit "$c" --scratch "$PWD"
    grep -E "of the PCIe bound" "$out/bench-$v-$i.txt" | sed "s/^/$v $i: /" | tee -a "$log"
  done
done
tar -C "$out" -cJf "$out/../hooks-ab.tar.xz" .
