"""The thirty-seventh session (issue 16, "the program killed mid-migration: the driver frees
everything; nothing leaks on the host"): the benchmark's training loop under `tiermem run` at
half its peak, killed with SIGKILL at several moments after tiermem began moving chunks; after
each kill, the GPU's used memory (nvidia-smi), the host's available memory (/proc/meminfo),
/dev/shm and /tmp, and the processes left are compared with before.

Usage (on the GPU machine): python3 scripts/gpu/probes/kill_mid_migration.py OUT TIERMEM [BUDGET_BYTES]
Writes OUT/kill.json."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

out, tiermem = pathlib.Path(sys.argv[1]), sys.argv[2]
budget = sys.argv[3] if len(sys.argv) > 3 else str(17504927744 // 2)  # half the loop's peak on the H200
DELAYS_S = [0.0, 0.15, 0.4, 0.75, 1.3]


def gpu_used_mib():
    text = subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"])
    return int(text.split()[0])


def available_mib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return None


def files():
    return {d: set(os.listdir(d)) for d in ("/dev/shm", "/tmp")}


def left_over():
    done = subprocess.run(["pgrep", "-f", "transparent_train.py"], capture_output=True, text=True)
    return [p for p in done.stdout.split() if p]


before = {"gpu_used_mib": gpu_used_mib(), "available_mib": available_mib()}
before_files = files()
trials = []
for i, delay in enumerate(DELAYS_S):
    trace = out / f"trace-{i}.jsonl"
    env = dict(os.environ, TIERMEM_TRACE=str(trace), TIERMEM_PEERS="off")
    command = [tiermem, "run", "--hbm-limit", budget, "--", sys.executable, "bench/transparent_train.py",
               "--out", str(out / f"train-{i}.json"), "--steps", "200"]
    started = time.time()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    moving, deadline, seen = None, time.time() + 120, b""
    while time.time() < deadline and proc.poll() is None:
        if trace.exists():
            with open(trace, "rb") as f:
                f.seek(max(len(seen) - 64, 0))
                seen = seen[: max(len(seen) - 64, 0)] + f.read()
            if b'"event": "moves"' in seen:
                moving = time.time()
                break
        time.sleep(0.02)
    trial = {"delay_after_first_moves_s": delay, "moving_seen": moving is not None}
    if moving is not None:
        time.sleep(delay)
        lines = trace.read_bytes().decode(errors="replace").splitlines()
        trial["moves_events_before_kill"] = sum('"event": "moves"' in line for line in lines)
        trial["last_event_before_kill"] = lines[-1][:300] if lines else None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    trial["exit"] = proc.returncode
    trial["seconds_run"] = round(time.time() - started, 1)
    time.sleep(2)  # the driver's teardown of the dead process
    trial["gpu_used_mib_after"] = gpu_used_mib()
    trial["available_mib_after"] = available_mib()
    now = files()
    trial["new_files"] = {d: sorted(now[d] - before_files[d] - {p.name for p in out.iterdir()}) for d in now}
    trial["processes_left"] = left_over()
    trial["gpu_back"] = abs(trial["gpu_used_mib_after"] - before["gpu_used_mib"]) <= 64
    trial["host_back"] = trial["available_mib_after"] >= before["available_mib"] - 1024
    trial["nothing_left"] = not any(trial["new_files"].values()) and not trial["processes_left"]
    trials.append(trial)
    print(json.dumps(trial), flush=True)
    trace.unlink(missing_ok=True)

report = {"before": before, "budget_bytes": int(budget), "trials": trials,
          "all_clean": all(t["moving_seen"] and t["gpu_back"] and t["host_back"] and t["nothing_left"] for t in trials)}
(out / "kill.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps({k: report[k] for k in ("before", "all_clean")}))
