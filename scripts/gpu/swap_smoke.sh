#!/usr/bin/env bash
# The VRAM swap device end to end, on the GPU machine, as root (never on a shared development
# machine: it enables swap and attaches loop devices).
#
#   scripts/gpu/swap_smoke.sh [TIERMEM] [OUT]
#     TIERMEM  the tiermem program (default dist/tiermem)
#     OUT      a folder for the log (default ./swap-smoke-<time>)
#   SWAP_SIZE (4GiB), WORKING_SET_MIB (3072), MEMORY_MAX_MIB (1024), SCRATCH (./gpu-scratch: the
#   spill file's folder, on a disk), SWAP_DEVICES (2), WORKLOAD_TIMEOUT_S (1800).
#
# Steps: `tiermem swap on --size 4GiB`; its loop devices in /proc/swaps at priority 100; a
# Python program in a cgroup whose memory.max is a third of its working set writes a pattern
# unique to every page, reads it all back twice (in order and shuffled), rewrites part and
# reads again, verifying every page; our devices must have been used; no task hung;
# `tiermem swap off`; nothing of ours left in /proc/swaps, losetup or the mounts. Everything is
# undone on any exit (trap), by `tiermem swap off` and, failing that, by hand. Exit 0 only if
# every check passed.
set -uo pipefail
tiermem=${1:-dist/tiermem}
out=${2:-swap-smoke-$(date +%Y%m%d-%H%M%S)}
size=${SWAP_SIZE:-4GiB}
ws_mib=${WORKING_SET_MIB:-3072}
max_mib=${MEMORY_MAX_MIB:-1024}
scratch=${SCRATCH:-$PWD/gpu-scratch}
devices=${SWAP_DEVICES:-2}
workload_timeout=${WORKLOAD_TIMEOUT_S:-1800}
run_dir=${TIERMEM_RUN_DIR:-/run/tiermem/swap}
cgroup=/sys/fs/cgroup/tiermem-swap-smoke-$$

mkdir -p "$out" "$scratch"
log=$out/log.txt
exec > >(tee -a "$log") 2>&1
failures=()
check() { # check NAME COMMAND...: runs the command, records a failure if it fails
  local name=$1; shift
  if "$@"; then echo "PASS: $name"; else echo "FAIL: $name"; failures+=("$name"); fi
}
step() { echo; echo "=== $*"; }
die() { echo "FAIL: $*"; failures+=("$*"); exit 1; }

sampler_pid= workload_pid= loops=
cleanup() {
  local rc=$?
  step "cleanup"
  [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null
  [ -n "$workload_pid" ] && kill -9 $workload_pid 2>/dev/null
  if [ -d "$cgroup" ]; then
    # Anything left in the cgroup dies with it.
    echo 1 > "$cgroup/cgroup.kill" 2>/dev/null
    for _ in $(seq 50); do [ -s "$cgroup/cgroup.procs" ] || break; sleep 0.1; done
    rmdir "$cgroup" 2>/dev/null || echo "could not remove $cgroup"
  fi
  if ! "$tiermem" swap off --timeout 900; then
    echo "tiermem swap off failed: undoing by hand"
    for dev in $loops $(losetup -l -n -O NAME,BACK-FILE 2>/dev/null | awk -v d="$run_dir/mnt/" 'index($2, d) == 1 {print $1}'); do
      grep -q "^$dev " /proc/swaps && swapoff "$dev"
      losetup -d "$dev" 2>/dev/null
    done
    grep -q " $run_dir/mnt " /proc/mounts && umount -l "$run_dir/mnt"
    server=$(python3 -c "import json; print(json.load(open('$run_dir/state.json'))['pid'])" 2>/dev/null)
    [ -n "$server" ] && kill -9 "$server" 2>/dev/null
    rm -f "$run_dir/state.json"
  fi
  local left
  left=$(grep -c "^/dev/loop" /proc/swaps 2>/dev/null)
  for dev in $loops; do
    if grep -q "^$dev " /proc/swaps || losetup "$dev" >/dev/null 2>&1; then
      echo "FAIL: $dev is still swap or attached"; failures+=("$dev left behind")
    fi
  done
  if grep -q " $run_dir/mnt " /proc/mounts; then echo "FAIL: $run_dir/mnt still mounted"; failures+=("mount left behind"); fi
  echo "loop swap areas now: $left"
  cat /proc/swaps
  echo
  if [ ${#failures[@]} -eq 0 ] && [ "$rc" -eq 0 ]; then
    echo "swap smoke: PASSED (log: $log)"
    exit 0
  fi
  echo "swap smoke: FAILED (exit $rc): ${failures[*]:-}"
  echo "server log (last 40 lines):"; tail -40 "$run_dir/serve.log" 2>/dev/null
  exit 1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "preconditions"
[ "$(id -u)" -eq 0 ] || die "run as root"
[ -x "$tiermem" ] || die "$tiermem is not a program (build with scripts/gpu/build.sh)"
command -v python3 >/dev/null || die "python3 is missing"
grep -qw memory /sys/fs/cgroup/cgroup.controllers || die "no cgroup v2 memory controller"
grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control \
  || die "cannot enable the memory controller for child cgroups"
"$tiermem" swap status --json | grep -q '"running":false' || die "tiermem swap is already on, or left over: tiermem swap off first"
echo "kernel $(uname -r); vm.swappiness $(cat /proc/sys/vm/swappiness); vm.page-cluster $(cat /proc/sys/vm/page-cluster)"
[ "$(cat /proc/sys/vm/swappiness)" -gt 0 ] || echo "WARNING: vm.swappiness is 0: the kernel avoids swapping anonymous memory"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>/dev/null
echo "/proc/swaps before:"; cat /proc/swaps
hung_before=$(dmesg 2>/dev/null | grep -c "blocked for more than")

step "tiermem swap on --size $size --devices $devices"
rm -f "$scratch/swap-spill" # a crashed run's; nothing of ours runs (checked above)
start=$(date +%s.%N)
loops=$("$tiermem" swap on --size "$size" --devices "$devices" --spill "$scratch/swap-spill") || die "tiermem swap on failed"
echo "on in $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo '?') s: $loops"
for dev in $loops; do
  check "$dev is swap at priority 100" awk -v d="$dev" '$1 == d && $5 == 100 {found=1} END {exit !found}' /proc/swaps
  check "$dev has direct I/O on" grep -qx 1 "/sys/block/$(basename "$dev")/loop/dio"
done
check "tiermem swap status" "$tiermem" swap status
# A second `swap on` is refused while one runs.
check "a second swap on is refused" bash -c "! '$tiermem' swap on --size 1GiB 2>/dev/null"

step "workload: ${ws_mib} MiB working set under memory.max ${max_mib} MiB"
mkdir "$cgroup" || die "mkdir $cgroup"
echo $((max_mib << 20)) > "$cgroup/memory.max" || die "memory.max"
echo max > "$cgroup/memory.swap.max" 2>/dev/null
# Sample our devices' use of swap while the workload runs.
( peak=0; while sleep 0.5; do
    used=$(awk -v l="$loops" 'BEGIN{n=split(l,a," "); for(i=1;i<=n;i++) w[a[i]]=1} ($1 in w) {s+=$4} END {print s+0}' /proc/swaps)
    [ "$used" -gt "$peak" ] && peak=$used && echo "$peak" > "$out/peak_used_kib"
  done ) &
sampler_pid=$!
cat > "$out/workload.py" <<'EOF'
import os, random, sys, time
MIB, PAGE = 1 << 20, 4096
chunks = int(sys.argv[1])
def chunk(i, generation):
    # Every page unique: its index and the generation, repeated over the page.
    return b"".join(((generation << 40 | i << 8 | p).to_bytes(8, "little") * (PAGE // 8)) for p in range(MIB // PAGE))
t0 = time.time()
data = [bytearray(chunk(i, 0)) for i in range(chunks)]
print(f"written {chunks} MiB in {time.time() - t0:.1f} s", flush=True)
gen = [0] * chunks
def verify(order, label):
    t = time.time(); bad = [i for i in order if data[i] != chunk(i, gen[i])]
    print(f"{label}: {len(order)} MiB verified in {time.time() - t:.1f} s, {len(bad)} bad", flush=True)
    return bad
bad = verify(range(chunks), "in order")
order = list(range(chunks)); random.Random(14).shuffle(order)
bad += verify(order, "shuffled")
for i in order[: chunks // 3]:
    gen[i] = 1; data[i][:] = chunk(i, 1)
bad += verify(range(chunks), "after rewriting a third")
print(f"total {time.time() - t0:.1f} s", flush=True)
if bad:
    print(f"MISMATCH in chunks {sorted(set(bad))[:20]}", flush=True); sys.exit(1)
print("every page verified", flush=True)
EOF
start=$(date +%s.%N)
timeout "$workload_timeout" bash -c "echo \$\$ > '$cgroup/cgroup.procs' && exec python3 '$out/workload.py' $ws_mib" &
workload_pid=$!
wait "$workload_pid"; workload_rc=$?; workload_pid=
echo "workload exit $workload_rc after $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo '?') s"
kill "$sampler_pid" 2>/dev/null; sampler_pid=
echo "cgroup memory.events:"; cat "$cgroup/memory.events"
echo "cgroup memory.swap.current at the end: $(cat "$cgroup/memory.swap.current" 2>/dev/null)"
check "the workload verified every page" test "$workload_rc" -eq 0
check "the workload was not OOM-killed" awk '$1 == "oom_kill" {exit $2 != 0}' "$cgroup/memory.events"
peak=$(cat "$out/peak_used_kib" 2>/dev/null || echo 0)
echo "peak use of our devices: ${peak} KiB"
check "our devices held swapped pages" test "$peak" -gt $(((ws_mib - max_mib) * 1024 / 4))
check "tiermem swap status after the workload" "$tiermem" swap status
hung_after=$(dmesg 2>/dev/null | grep -c "blocked for more than")
check "no task hung (dmesg: blocked for more than)" test "$hung_after" -eq "$hung_before"
stuck=$(grep -l -E "blk_mq|loop_|fuse_" /proc/[0-9]*/stack 2>/dev/null | head -5)
[ -n "$stuck" ] && echo "tasks in the block layer or FUSE right now: $stuck"
echo 1 > "$cgroup/cgroup.kill" 2>/dev/null; rmdir "$cgroup" 2>/dev/null

step "tiermem swap off"
start=$(date +%s.%N)
check "tiermem swap off" "$tiermem" swap off --timeout 900
echo "off in $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo '?') s"
for dev in $loops; do
  check "$dev is no longer swap" bash -c "! grep -q '^$dev ' /proc/swaps"
  check "$dev is detached" bash -c "! losetup '$dev' >/dev/null 2>&1"
done
check "the FUSE mount is gone" bash -c "! grep -q ' $run_dir/mnt ' /proc/mounts"
check "swap status says off" bash -c "'$tiermem' swap status --json | grep -q '\"running\":false'"
check "the spill file is gone" test ! -e "$scratch/swap-spill"
loops= # nothing left to undo

# The server killed with swap active (docs/swap.md, "When the server dies"): two holders keep
# pages on our devices; after `kill -9` of the server, status and on name the dead server,
# holder A touches its pages (lost ones must raise SIGBUS, never come back wrong), `swap off`
# completes while holder B still maps lost pages, B then gets SIGBUS too, and `on` works again.
# SWAP_KILL=0 skips it.
[ "${SWAP_KILL:-1}" = 0 ] && exit 0
step "the server killed with swap active"
rm -f "$scratch/swap-spill"
loops=$("$tiermem" swap on --size "$size" --devices "$devices" --spill "$scratch/swap-spill") || die "tiermem swap on (kill test) failed"
mkdir "$cgroup" || die "mkdir $cgroup"
echo $((max_mib << 20)) > "$cgroup/memory.max" || die "memory.max"
cat > "$out/holder.py" <<'EOF2'
import os, signal, sys, time
MIB = 1 << 20
name, mib, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
page = lambda i: (i.to_bytes(8, "little") * (MIB // 8))
data = [bytearray(page(i)) for i in range(mib)]
print(f"{name}: {mib} MiB written", flush=True)
open(f"{go}.{name}.ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.2)
bad = sum(data[i] != page(i) for i in range(mib))  # a lost page raises SIGBUS here
print(f"{name}: every page came back, {bad} wrong", flush=True)
sys.exit(1 if bad else 0)
EOF2
go_a=$out/go-a go_b=$out/go-b half=$((ws_mib / 2))
# Waits up to 120 s for holder PID to end (its exit status), else kills it (status 255).
await() {
  for _ in $(seq 240); do kill -0 "$1" 2>/dev/null || { wait "$1"; return; }; sleep 0.5; done
  echo "FAIL: holder $1 still runs after 120 s (stuck on a lost page?)"; kill -9 "$1"; wait "$1"; return 255
}
bash -c "echo \$\$ > '$cgroup/cgroup.procs' && exec python3 '$out/holder.py' a $half '$go_a'" & holder_a=$!
bash -c "echo \$\$ > '$cgroup/cgroup.procs' && exec python3 '$out/holder.py' b $half '$go_b'" & holder_b=$!
workload_pid="$holder_a $holder_b"
for _ in $(seq 600); do [ -e "$go_a.a.ready" ] && [ -e "$go_b.b.ready" ] && break; sleep 0.5; done
check "both holders wrote their pages" test -e "$go_a.a.ready" -a -e "$go_b.b.ready"
used=$(awk -v l="$loops" 'BEGIN{n=split(l,a," "); for(i=1;i<=n;i++) w[a[i]]=1} ($1 in w) {s+=$4} END {print s+0}' /proc/swaps)
echo "our devices hold $used KiB"
check "our devices hold the holders' pages" test "$used" -gt 0
server=$(python3 -c "import json; print(json.load(open('$run_dir/state.json'))['pid'])")
echo "kill -9 the server ($server)"
kill -9 "$server"
for _ in $(seq 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
"$tiermem" swap status > "$out/status-dead.txt" 2>&1; status_rc=$?
cat "$out/status-dead.txt"
check "swap status exits 1 after the server died" test "$status_rc" -eq 1
check "swap status names the dead server" grep -q "$server" "$out/status-dead.txt"
check "swap on refuses while the dead server's devices are there" bash -c "! '$tiermem' swap on --size 1GiB 2>/dev/null"
touch "$go_a"; await "$holder_a"; rc_a=$?
echo "holder a exit $rc_a (135: SIGBUS)"
check "holder a's lost pages raise SIGBUS, none comes back wrong" test "$rc_a" -eq 135
start=$(date +%s.%N)
check "tiermem swap off after the server died (holder b still maps lost pages)" timeout 600 "$tiermem" swap off --timeout 540
echo "off in $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo '?') s"
touch "$go_b"; await "$holder_b"; rc_b=$?
echo "holder b exit $rc_b (135: SIGBUS)"
check "holder b's lost pages raise SIGBUS after swap off, none comes back wrong" test "$rc_b" -eq 135
workload_pid=
for dev in $loops; do
  check "$dev is no longer swap" bash -c "! grep -q '^$dev ' /proc/swaps"
  check "$dev is detached" bash -c "! losetup '$dev' >/dev/null 2>&1"
done
check "the dead server's FUSE mount is gone" bash -c "! grep -q ' $run_dir/mnt ' /proc/mounts"
loops=
echo 1 > "$cgroup/cgroup.kill" 2>/dev/null; rmdir "$cgroup" 2>/dev/null
loops=$("$tiermem" swap on --size 1GiB --devices 1 --spill "$scratch/swap-spill") && echo "on again: $loops"
check "swap on works again after the cleanup" test -n "$loops"
check "and off" "$tiermem" swap off --timeout 120
loops=
hung_after=$(dmesg 2>/dev/null | grep -c "blocked for more than")
check "no task hung (dmesg: blocked for more than)" test "$hung_after" -eq "$hung_before"
