"""`tiermem run --policy` on the GPU (issue 16): each policy (auto with and without stage 3's
trial, hotness; placement with POLICIES=all; auto alone with POLICIES=auto) on a
decoder whose weights are read once a token (bench/matrix/hf_decode.py, at 0.5x its peak) and on
the training loop of `bench transparent` (bench/transparent_train.py, at 0.7x its peak): speed
as a fraction of the plain run's, and whether the results are bitwise the plain run's.
POLICY_JOBS=hf_decode or =train runs that job alone. Writes OUT/policies.json and prints one line a run.
Usage (on the GPU machine, after building dist/ here): python3 policies.py TIERMEM OUT"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

tiermem, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
root = Path(__file__).resolve().parents[3]
env = {**os.environ, "TIERMEM_PEERS": "off"}


def last_json(text):
    for line in reversed(text.splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def said(stderr):
    """What tiermem said of stage 3's trial, if anything."""
    return [line for line in stderr.splitlines() if "stage 3 on trial" in line]


def decode(prefix, extra_env):
    done = subprocess.run([*prefix, sys.executable, "hf_decode.py"], capture_output=True, text=True,
                          cwd=root / "bench/matrix", env={**env, **extra_env}, timeout=240)
    report = last_json(done.stdout) or {}
    return done.returncode, report, done.stderr


def train(prefix, extra_env, steps=12):
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        done = subprocess.run([*prefix, sys.executable, "bench/transparent_train.py", "--steps", str(steps),
                               "--out", result.name], capture_output=True, text=True, cwd=root,
                              env={**env, **extra_env}, timeout=240)
        report = json.load(open(result.name)) if done.returncode == 0 else {}
    return done.returncode, report, done.stderr


# (label, --policy, more environment): POLICIES=all adds `placement`.
POLICIES = [("auto", "auto", {}), ("auto without the trial", "auto", {"TIERMEM_STAGE3_TRIAL": "off"}),
            ("hotness", "hotness", {})]
if os.environ.get("POLICIES") == "all":
    POLICIES.append(("placement", "placement", {}))
elif os.environ.get("POLICIES") == "auto":  # the trial's A/B alone
    POLICIES = POLICIES[:2]
results = {}
only = os.environ.get("POLICY_JOBS")  # e.g. hf_decode: that job alone
for name, job, share, speed_of, same in [
    ("hf_decode", decode, 0.5, lambda r: r.get("tokens_per_s"), lambda a, b: a.get("digest") == b.get("digest")),
    ("train", train, 0.7, lambda r: r.get("step_s_median") and 1 / r["step_s_median"],
     lambda a, b: a.get("losses") == b.get("losses")),
]:
    if only and name not in only.split(","):
        continue
    code, plain, err = job([], {})
    if code != 0:
        print(f"{name}: the plain run failed ({code}): {err[-400:]}", flush=True)
        continue
    peak = plain.get("peak_bytes") or plain.get("max_memory_reserved")
    budget = int(peak * share)
    runs = {"plain": {"speed": speed_of(plain)}}
    for label, policy, extra_env in POLICIES:
        started = time.perf_counter()
        code, capped, err = job([tiermem, "run", "--hbm-limit", str(budget), "--policy", policy, "--stats", "--"],
                                extra_env)
        speed = speed_of(capped) if code == 0 else None
        runs[label] = {"exit": code, "seconds": round(time.perf_counter() - started, 1),
                       "identical": code == 0 and same(plain, capped),
                       "speed_vs_plain": speed and round(speed / runs["plain"]["speed"], 3),
                       "trial": said(err), "steps_s": [round(t, 3) for t in capped.get("step_s", [])],
                       "stderr_tail": "" if code == 0 else err[-400:]}
        print(f"{name} at {share}x ({budget} bytes), {label}: {runs[label]}", flush=True)
    results[name] = {"budget_bytes": budget, "share": share, "runs": runs}
    (out / "policies.json").write_text(json.dumps(results, indent=1) + "\n")
