#!/usr/bin/env python3
"""Accounting that adds up (issue 13), on a real GPU: tiermemd, two tenants that each want
more than half the GPU, and a process that is no tenant holding GPU memory of its own.

Checks, from `tiermem status --json` and nvidia-smi, while all run and after the foreign
process exits:
* the HBM capacity the daemon shares out is at most the GPU less what the driver says the
  others hold and what tenant processes hold beyond their chunks (census.rs);
* the tenants' chunks + their processes' overhead + other processes = what the driver
  counts as used (within what moves between two reports);
* every tenant's overhead is what nvidia-smi says its process holds less its chunks;
* the tenants finish with every byte checked (no acquire failed for want of memory);
* when the foreign process exits, the capacity grows back;
* with ``--outside-gib N``, the first tenant also holds N GiB outside tiermem (a plain
  allocation): its overhead is charged to its own share, so its budget's target is N GiB below
  the other's (the tenants' contexts are alike), not N/2 below each. (Only while they contend:
  give each a working set above half the GPU, e.g. ``--tenant-gib 80``; tenants that both fit
  get what they ask whatever their overheads.)

Usage: accounting.py TIERMEM_BINARY OUT_JSON [--foreign-gib 20] [--tenant-gib 65] [--outside-gib 0]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30


def status(tiermem, socket):
    out = subprocess.run([tiermem, "status", "--json", "--socket", socket], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def smi_processes():
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout
    return {int(p): int(m) << 20 for p, m in (line.split(",") for line in out.strip().splitlines() if line.strip())}


def snapshot(tiermem, socket):
    report = status(tiermem, socket)
    hbm = next(p for p in report["pools"] if p["tier"] == "hbm")
    return {"report": report, "smi": smi_processes(), "hbm": hbm}


def checks(snap, tenant_pids, foreign_pid):
    hbm, smi = snap["hbm"], snap["smi"]
    driver = hbm.get("driver") or {}
    out = {"capacity": hbm["capacity"], "budgeted": hbm["budgeted"], "chunks_used": hbm["used"], "driver": driver}
    if not driver or driver.get("note"):
        out["ok"] = False
        return out
    others = sum(b for pid, b in smi.items() if pid not in tenant_pids)
    out["smi_others"] = others
    out["capacity_within_driver"] = hbm["capacity"] <= driver["total"] - driver["others"] - driver["overhead"]
    out["budgets_within_capacity"] = hbm["budgeted"] <= hbm["capacity"]
    out["adds_up_error_bytes"] = abs(hbm["used"] + driver["overhead"] + driver["others"] - driver["used"])
    tenants = {t["pid"]: t for t in snap["report"]["tenants"]}
    chunks = {t["pid"]: 0 for t in snap["report"]["tenants"]}
    for share in hbm["shares"]:
        pid = next(t["pid"] for t in snap["report"]["tenants"] if t["tenant"] == share["tenant"])
        chunks[pid] += share["used"]
    out["overhead_by_pid"] = {pid: t.get("overhead") for pid, t in tenants.items()}
    out["smi_minus_chunks_by_pid"] = {pid: smi.get(pid, 0) - chunks[pid] for pid in tenants}
    out["others_match_smi"] = abs(driver["others"] - others) <= 64 << 20
    out["budget_by_pid"], out["target_by_pid"] = {}, {}
    for share in hbm["shares"]:
        pid = next(t["pid"] for t in snap["report"]["tenants"] if t["tenant"] == share["tenant"])
        out["budget_by_pid"][pid] = share["budget"]
        out["target_by_pid"][pid] = share["target"]  # where its budget is going (grants are staged)
    out["ok"] = out["capacity_within_driver"] and out["budgets_within_capacity"] and out["others_match_smi"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tiermem")
    ap.add_argument("out", type=Path)
    ap.add_argument("--foreign-gib", type=int, default=20)
    ap.add_argument("--tenant-gib", type=int, default=65)
    ap.add_argument("--outside-gib", type=int, default=0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tiermem-accounting-"))
    socket, stop = str(tmp / "tiermemd.sock"), tmp / "stop"
    env = dict(os.environ, TIERMEM_DAEMON=socket, TIERMEM_PEERS="off")
    env.pop("TIERMEM_HBM_LIMIT", None)
    daemon = subprocess.Popen([args.tiermem, "daemon", "--socket", socket], stderr=open(tmp / "daemon.log", "w"))
    foreign = subprocess.Popen([sys.executable, "-c", (
        "import torch, time, sys; x = torch.empty(%d << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); "
        "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)") % args.foreign_gib],
        stdout=subprocess.PIPE, text=True)
    assert foreign.stdout.readline().strip() == "ready"
    outside = [["--outside", f"{args.outside_gib}GiB"]] if args.outside_gib else [[]]
    tenants = [subprocess.Popen([args.tiermem, "bench", "tenant-worker", "--working-set", f"{args.tenant_gib}GiB",
                                 "--buffer-size", "512MiB", "--stop-file", str(stop)] + extra,
                                env=env, stdout=subprocess.PIPE, text=True) for extra in outside + [[]]]
    result = {"foreign_gib": args.foreign_gib, "tenant_gib": args.tenant_gib, "outside_gib": args.outside_gib}
    try:
        time.sleep(12)  # the tenants fill their working sets (paging beyond their budgets)
        tenant_pids = {t.pid for t in tenants}
        result["with_foreign"] = checks(snapshot(args.tiermem, socket), tenant_pids, foreign.pid)
        foreign.kill()
        foreign.wait()
        time.sleep(4)  # a few censuses
        result["after_foreign_exit"] = checks(snapshot(args.tiermem, socket), tenant_pids, None)
        stop.touch()
        outcomes = [json.loads(t.communicate(timeout=300)[0].strip().splitlines()[-1]) for t in tenants]
        result["tenants"] = [{k: o[k] for k in ("rounds", "mismatched_words", "retries", "hbm_cap")} for o in outcomes]
        result["tenants_ok"] = all(o["mismatched_words"] == 0 for o in outcomes) and all(t.returncode == 0 for t in tenants)
        grew = result["after_foreign_exit"]["capacity"] - result["with_foreign"]["capacity"]
        result["capacity_grew_bytes"] = grew
        targets = result["after_foreign_exit"]["target_by_pid"]
        gap = targets.get(tenants[1].pid, 0) - targets.get(tenants[0].pid, 0)
        result["target_gap_bytes"] = gap  # the second tenant's target less the first's
        result["charged_to_its_own_share"] = abs(gap - args.outside_gib * GIB) <= GIB // 2
        result["verified"] = bool(result["with_foreign"]["ok"] and result["after_foreign_exit"]["ok"]
                                  and result["tenants_ok"] and grew >= (args.foreign_gib - 1) * GIB
                                  and result["charged_to_its_own_share"])
    finally:
        for p in tenants + [foreign, daemon]:
            if p.poll() is None:
                p.kill()
        result["daemon_log"] = (tmp / "daemon.log").read_text()[-2000:]
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "daemon_log"}, indent=1))


if __name__ == "__main__":
    main()
