#!/usr/bin/env bash
# Runs on the GPU machine: every test binary, the demo and the benchmarks, in one go.
# Usage: scripts/gpu/run.sh DIST OUT COMMIT [PHASES]
#   DIST   folder made by scripts/gpu/build.sh (binaries, test binaries, wheels)
#   OUT    folder for logs and JSON results
#   COMMIT the commit being measured
#   PHASES comma-separated, default all: rust,demo,limits,soak,python,engine,tenants,nvme,torch (torch-small:
#          the torch benchmark's smoke test). Not in the default, asked for by name: swap (bench swap:
#          enables swap, loop devices, zram, cgroups as root, all undone at the end; at most 9 minutes)
#          and swap-quick (its smoke test, at most 4 minutes); swap-store (bench swap-store: the swap
#          device's store alone, no root, seconds); transparent (bench transparent: an unmodified
#          PyTorch training loop under tiermem run; needs dist/libtiermem_preload.so); peer (bench peer: GPU 0 borrows GPU 1's HBM;
#          needs two GPUs with peer access, e.g. nvidia-h200-x2; PEER_ARGS adds to it).
# SOAK_SECONDS (default 300) and SOAK_THREADS (default 8) size the soak; TENANTS_ARGS adds to bench tenants;
# SWAP_ARGS adds to bench swap (e.g. "--size 2GiB --swap-args=--devices=4"); SWAP_TIMEOUT (default 540 s)
# ends it (SIGTERM: it stops and undoes what it set up; SIGKILL 20 s later, then the cleanup here).
set -uo pipefail
dist=$1 out=$2 commit=$3 phases=${4:-rust,demo,limits,soak,python,engine,tenants,nvme,torch}
want() { [[ ",$phases," == *",$1,"* ]]; }
mkdir -p "$out/results"
status=0
step() { echo; echo "=== $* ($(date +%T))"; }
run() { "$@" 2>&1 | tee -a "$out/log.txt"; local rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "FAILED ($rc): $*"; status=1; }; }

step "GPU"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee -a "$out/log.txt"
step "tiermem info"; run "$dist/tiermem" info
# Files of the file tier's tests and benchmark go on the machine's disk (O_DIRECT).
scratch=$PWD/gpu-scratch
mkdir -p "$scratch"
export TIERMEM_TEST_FILE_DIR=$scratch TIERMEM_FS_TEST_DIR=$scratch
# The tests and the PCIe benchmarks measure the host and file tiers: no neighbour lends unless
# asked (the peer phase names its lender itself).
export TIERMEM_PEERS=${TIERMEM_PEERS:-off}
if want rust; then
  [ -f "$dist/tests.tar.xz" ] && tar -C "$dist" -xJf "$dist/tests.tar.xz"
  for t in "$dist"/tests/*; do
    step "tests on the GPU: $(basename "$t")"
    TIERMEM_TEST_BACKEND=cuda run "$t" --test-threads=1 --nocapture
  done
fi
if want python || want torch || want torch-small || want peer; then
  step "install the wheel"; run python3 -m pip install -q --no-index --no-deps "$dist"/wheels/*.whl
fi
want python && { step "Python tests on the GPU"; TIERMEM_TEST_BACKEND=cuda run python3 -m pytest -q -rs python/tests; }
want demo && { step "tiermem demo"; run "$dist/tiermem" demo; }
if want limits; then
  step "caps beyond the machine are clear errors, before anything is allocated"
  for setting in TIERMEM_HBM_LIMIT=100TiB TIERMEM_HOST_LIMIT=100TiB "TIERMEM_FILE=$scratch/f TIERMEM_FILE_LIMIT=100TiB"; do
    echo "--- $setting"; env $setting "$dist/tiermem" demo --rounds 2 2>&1 | tail -2 | tee -a "$out/log.txt"
  done
fi
want soak && { step "tiermem soak"; TIERMEM_COMMIT=$commit run "$dist/tiermem" soak --seconds "${SOAK_SECONDS:-300}" --threads "${SOAK_THREADS:-8}" --file "$scratch/soak-file" --json "$out/results"; }
want engine && { step "tiermem bench engine"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench engine --json "$out/results"; }
want peer && { step "tiermem bench peer"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench peer --json "$out/results" --decode bench/torch_bench.py ${PEER_ARGS:-}; }
want swap-store && { step "tiermem bench swap-store"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench swap-store --json "$out/results"; }
want tenants && { step "tiermem bench tenants"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench tenants --json "$out/results" ${TENANTS_ARGS:-}; }
want transparent && { step "tiermem bench transparent"; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench transparent --json "$out/results"; }
want nvme && { step "tiermem bench nvme"; df -T "$scratch" | tail -1; TIERMEM_COMMIT=$commit run "$dist/tiermem" bench nvme --json "$out/results" --dir "$scratch" --reps 5; }
# Undoes whatever a bench swap that was killed left behind: swap areas, loop devices over its
# files, zram, zswap, cgroups, files (a finished run has undone it all itself).
in_swaps() { awk -v s="$2" 'NR > 1 && $1 == s { found = 1 } END { exit !found }' "$1"; }
swap_cleanup() {
  [ -n "${swap_cleaned:-}" ] && return 0
  swap_cleaned=1
  echo "--- swap cleanup"
  timeout 120 "$dist/tiermem" swap off 2>&1 | tail -3
  tail -n +2 /proc/swaps | awk '{print $1}' | while read -r s; do
    in_swaps "$out/swaps-before.txt" "$s" || { echo "swapoff $s"; timeout 300 swapoff "$s"; }
  done
  tail -n +2 "$out/swaps-before.txt" | while read -r s _ _ _ p; do
    in_swaps /proc/swaps "$s" && continue
    echo "swapon $s (it was on before)"
    if [ "$p" -ge 0 ]; then swapon -p "$p" "$s"; else swapon "$s"; fi
  done
  losetup -n -O NAME,BACK-FILE -l 2>/dev/null | awk '$2 ~ /tiermem-swapbench-/ {print $1}' | while read -r d; do
    echo "losetup -d $d"; losetup -d "$d"
  done
  for m in "$scratch"/tiermem-swapbench-zram-*; do
    [ -e "$m" ] || continue
    id=${m##*-}; echo "zram$id reset"
    echo 1 >"/sys/block/zram$id/reset"; echo "$id" >/sys/class/zram-control/hot_remove 2>/dev/null
  done
  [ -e "$scratch/tiermem-swapbench-zswap-was-on" ] && echo Y >/sys/module/zswap/parameters/enabled
  [ -e "$scratch/tiermem-swapbench-page-cluster-was" ] && cat "$scratch/tiermem-swapbench-page-cluster-was" >/proc/sys/vm/page-cluster
  for g in /sys/fs/cgroup/tiermem-swapbench-*/; do
    [ -d "$g" ] || continue
    for c in "$g"*/; do
      [ -d "$c" ] || continue
      echo 1 >"$c/cgroup.kill" 2>/dev/null; sleep 0.5; rmdir "$c"
    done
    rmdir "$g"
  done
  rm -f "$scratch"/tiermem-swapbench-* /tmp/tiermem-swapbench-*
  cat /proc/swaps; losetup -l; free -g
}
if want swap || want swap-quick; then
  step "tiermem bench swap"
  swap_args=(--json "$out/results" --dir "$scratch" --fio "$dist/fio")
  want swap-quick && ! want swap && swap_args+=(--quick)
  cat /proc/swaps >"$out/swaps-before.txt"
  trap swap_cleanup EXIT
  trap 'swap_cleanup; exit 1' INT TERM
  df -T "$scratch" | tail -1
  PATH="$dist:$PATH" TIERMEM_ALLOW_SWAP=1 TIERMEM_COMMIT=$commit run timeout -k 20 "${SWAP_TIMEOUT:-540}" "$dist/tiermem" bench swap "${swap_args[@]}" ${SWAP_ARGS:-}
  swap_cleanup 2>&1 | tee -a "$out/log.txt"
  trap - EXIT INT TERM
  echo "--- kernel log: hung tasks, OOM kills, I/O errors"
  dmesg 2>/dev/null | grep -iE "blocked for more than|hung_task|oom-kill|out of memory|I/O error|loop[0-9]+:|zram|fuse" | tail -30 | tee -a "$out/log.txt"
fi
want torch-small && { step "torch benchmark (small)"; run python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --small --scratch "$scratch"; }
want torch && { step "torch benchmark"; run python3 bench/torch_bench.py --json "$out/results" --commit "$commit" --scratch "$scratch"; }
step "done: status $status"
exit $status
