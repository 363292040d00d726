#!/usr/bin/env bash
# The twenty-seventh session's A/B: bench tenants with linked tenants pinning room to evict
# into ahead of a cut (TIERMEM_EVICT_ROOM=on, the default) and without (off), alternating.
# Rerun since the thirty-first session with jobs of 20 rounds (the default since the twenty-ninth)
# and each throughput set three times (`--repeats 3`: five became the default in the
# thirty-third session, ~6 min a run), medians counted (~3.3 min a run, ~4 with the hog and the
# overhead repeated too since the thirty-second session, so one run each way by
# default fits a call of 10 min): the linked tenants' rounds still stalled twice in the three-job phase with room
# pinned gently, and each round's end now says where its time went (the detail's
# `rounds_columns`: evict waits, the driver's map and pin milliseconds, pinned bytes;
# scripts/gpu/probes/slow_rounds.py lists the slow ones).
# Usage (on the GPU machine, after scripts/gpu/build.sh here): scripts/gpu/probes/evict_room_ab.sh OUT COMMIT [RUNS]
set -u
out=$1 commit=$2 runs=${3:-1}
mkdir -p "$out"; log=$out/log.txt
export TIERMEM_PEERS=off
for i in $(seq "$runs"); do
  for room in on off; do
    echo "=== bench tenants, TIERMEM_EVICT_ROOM=$room, run $i ($(date +%T))" | tee -a "$log"
    TIERMEM_EVICT_ROOM=$room TIERMEM_COMMIT=$commit-room-$room-$i timeout 330 dist/tiermem bench tenants \
      --repeats 3 --json "$out/room-$room-$i" > "$out/room-$room-$i.log" 2>&1
    grep -E "GB/s|vs_|hog|fair|overhead|pairs|leak|reclaim|idle" "$out/room-$room-$i.log" | tail -14 | tee -a "$log"
  done
done
tar -C "$out" -cJf "$out/../evict-room-ab.tar.xz" .
