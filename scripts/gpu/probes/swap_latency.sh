#!/usr/bin/env bash
# Where a 32 KiB read's time goes on the VRAM swap device's FUSE + loop path (issue 14): fio
# reads at queue depth 1 on a device served by `tiermem swap on --no-enable` (no swap is
# enabled), with the CPUs as the machine has them and again while /dev/cpu_dma_latency holds
# them out of deep idle states; the server's own timing of each request (`swap status --json`)
# beside fio's. GPU machine only, as root; everything is undone at the end.
# Usage: scripts/gpu/probes/swap_latency.sh DIST OUT SCRATCH
set -u
dist=$1 out=$2 scratch=$3
mkdir -p "$out" "$scratch"
T=$dist/tiermem FIO=$dist/fio
{
  for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
    echo "$(cat "$s/name") exit_latency_us=$(cat "$s/latency") disabled=$(cat "$s/disable") usage=$(cat "$s/usage")"
  done
  echo "governor $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo none)"
  echo "idle driver $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null)"
} > "$out/cpu.txt" 2>&1
"$T" swap on --size 2GiB --no-enable --spill "$scratch/probe-spill" > "$out/devices" 2> "$out/on.log" || { cat "$out/on.log"; exit 1; }
dev=$(head -1 "$out/devices")
"$FIO" --name=fill --filename="$dev" --rw=write --bs=1M --size=1G --direct=1 --ioengine=psync --output-format=json > "$out/fill.json"
read32k() {
  "$T" swap status --json > "$out/$1.before.json"
  "$FIO" --name="$1" --filename="$dev" --rw=randread --bs=32k --size=1G --direct=1 --ioengine=psync \
    --runtime=6 --time_based --output-format=json > "$out/$1.json"
  "$T" swap status --json > "$out/$1.after.json"
}
read32k plain
python3 -c 'import os, struct, time; fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY); os.write(fd, struct.pack("i", 0)); time.sleep(30)' &
holder=$!
sleep 0.5
read32k shallow_idle
kill $holder
"$T" swap off > "$out/off.log" 2>&1
python3 - "$out" <<'P'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
summary = {}
for name in ("plain", "shallow_idle"):
    job = json.loads((out / f"{name}.json").read_text())["jobs"][0]["read"]
    status = {w: json.loads((out / f"{name}.{w}.json").read_text())["requests"] for w in ("before", "after")}
    def mean_between(kind):
        b, a = status["before"].get(kind), status["after"].get(kind)
        if a is None:
            return None
        n = a["count"] - b["count"]
        return (a["mean_us"] * a["count"] - (b["mean_us"] or 0) * b["count"]) / max(n, 1)
    n = status["after"]["reads"]["count"] - status["before"]["reads"]["count"]
    server_mean, store_mean = mean_between("reads"), mean_between("reads_in_store")
    summary[name] = {"fio_lat_mean_us": job["lat_ns"]["mean"] / 1e3, "fio_clat_p50_us": job["clat_ns"]["percentile"]["50.000000"] / 1e3,
                     "fio_clat_p99_us": job["clat_ns"]["percentile"]["99.000000"] / 1e3, "iops": job["iops"], "server_mean_us": server_mean, "server_store_mean_us": store_mean, "server_reads": n}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
for f in out.iterdir():
    if f.name not in ("summary.json", "cpu.txt"):
        f.unlink()
print(json.dumps(summary, indent=1))
P
cat "$out/cpu.txt"
