#!/usr/bin/env python3
"""HBM lent between processes (issue 13), on two GPUs: `tiermem lend --gpu 1` exports slabs of
GPU 1's HBM through tiermemd to a tenant on GPU 0 (file descriptors over the socket); the
tenant's chunks beyond its HBM budget go there. Then a program starts on GPU 1 and takes its
free memory: the lender lowers its offer and the daemon asks the tenant to return slabs.

Speed: the same GPU job (`tiermem bench tenant-worker`: kernels check and rewrite every byte
of a working set three times the HBM budget each round), median of the later half of its rounds:
(a) no lender, peer tier off: what does not fit HBM goes to host memory;
(b) with the lender: it goes to the lent slabs;
(c) no lender, the engine borrowing from GPU 1 itself (TIERMEM_PEERS=1).
Reclaim: `tiermem tenant-demo` with the lender, and a program taking GPU 1's memory half-way.

Usage: lent_hbm.py TIERMEM_BINARY OUT_JSON [--budget-gib 4] [--working-set-gib 12] [--seconds 20]
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

GIB = 1 << 30


def status(tiermem, socket):
    out = subprocess.run([tiermem, "status", "--json", "--socket", socket], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def lent(report):
    return sum(b for l in (report or {}).get("lenders", []) for _, b in l["lent"])


def wait_for(what, condition, limit=60):
    start = time.time()
    while not condition():
        if time.time() - start > limit:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)
    return time.time() - start


def worker_speed(report, working_set):
    """GB/s of the later half of a worker's rounds (median round time)."""
    ends = [t for t, _, _ in report["rounds_trace"]]
    later = sorted([b - a for a, b in zip([0.0] + ends, ends)][len(ends) // 2:])
    return working_set / later[len(later) // 2] / 1e9 if later else None


def run(args, phase, lender, peers, worker=False):
    tmp = tempfile.mkdtemp(prefix=f"lent-{phase}-")
    socket = os.path.join(tmp, "tiermemd.sock")
    config = os.path.join(tmp, "tiermemd.toml")
    with open(config, "w") as f:
        f.write(f'[[gpu]]\nindex = 0\nhbm = "{args.budget_gib}GiB"\n[lending]\nreturn_deadline_ms = 5000\n')
    env = dict(os.environ, TIERMEM_BACKEND="cuda")
    procs = [subprocess.Popen([args.tiermem, "daemon", "--config", config, "--socket", socket], env=env,
                              stderr=open(os.path.join(tmp, "daemon.log"), "w"))]
    wait_for("the daemon", lambda: status(args.tiermem, socket) is not None)
    result = {"phase": phase}
    try:
        if lender:
            procs.append(subprocess.Popen([args.tiermem, "lend", "--gpu", "1", "--offer", f"{args.offer_gib}GiB",
                                           "--reserve", "4GiB", "--socket", socket], env=env,
                                          stderr=open(os.path.join(tmp, "lend.log"), "w")))
            wait_for("the lender", lambda: (status(args.tiermem, socket) or {}).get("lenders"))
        tenant_env = dict(env, TIERMEM_DAEMON=socket, TIERMEM_PEERS=peers, TIERMEM_HOST_LIMIT=f"{args.working_set_gib + 4}GiB",
                          CUDA_VISIBLE_DEVICES="0,1")
        tenant_env.pop("TIERMEM_HBM_LIMIT", None)
        start = time.time()
        command = ["bench", "tenant-worker", "--working-set", f"{args.working_set_gib}GiB", "--rounds", str(args.rounds)] \
            if worker else ["tenant-demo", "--working-set", f"{args.working_set_gib}GiB", "--buffer-size", "64MiB",
                            "--seconds", str(args.seconds)]
        tenant = subprocess.Popen([args.tiermem] + command,
                                  env=tenant_env, stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "tenant.log"), "w"))
        samples = []
        if lender and worker:
            result["lend_s"] = wait_for("slabs lent", lambda: lent(status(args.tiermem, socket)) > 0)
            samples.append({"t": time.time() - start, "status": status(args.tiermem, socket)})
        elif lender:
            want = (args.working_set_gib - args.budget_gib) * GIB
            result["lend_s"] = wait_for("slabs lent", lambda: lent(status(args.tiermem, socket)) >= min(want, args.offer_gib * GIB) * 0.9)
            time.sleep(args.seconds / 3)
            before = lent(status(args.tiermem, socket))
            # Another program takes GPU 1's free memory, leaving 1 GiB: the lender's reserve (4 GiB)
            # misses 3 GiB, which borrowers are asked to return.
            hog = subprocess.Popen(["python3", "-c", (
                "import torch, sys, time\n"
                "free, _ = torch.cuda.mem_get_info(1)\n"
                "x = torch.empty(free - (1 << 30), dtype=torch.uint8, device='cuda:1')\n"
                "print('held', free - (1 << 30), flush=True)\n"
                "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            held = hog.stdout.readline()
            t0 = time.time()
            result["hog_bytes"] = int(held.split()[1]) if held.startswith("held") else None
            result["reclaim_s"] = wait_for("slabs returned", lambda: lent(status(args.tiermem, socket)) <= before - 3 * GIB + 64 * (1 << 20))
            result["lent_before_hog"], result["lent_after_hog"] = before, lent(status(args.tiermem, socket))
            result["reclaimed_bytes"] = before - result["lent_after_hog"]
            result["reclaim_ms_per_GiB"] = result["reclaim_s"] * 1000 / max(result["reclaimed_bytes"] / GIB, 1e-9)
            samples.append({"t": time.time() - start, "status": status(args.tiermem, socket)})
        out, _ = tenant.communicate(timeout=args.seconds + 300)
        result["tenant_s"] = time.time() - start
        result["tenant_exit"] = tenant.returncode
        result["tenant"] = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
        if result["tenant"] and worker:
            result["GBps"] = worker_speed(result["tenant"], args.working_set_gib * GIB)
            result["verified"] = result["tenant_exit"] == 0 and result["tenant"]["mismatched_words"] == 0
        elif result["tenant"]:
            result["verified"] = result["tenant_exit"] == 0
        if lender and not worker:
            hog.stdin.close()
            hog.wait()
            time.sleep(0.5)
            result["lent_after_tenant"] = lent(status(args.tiermem, socket))
        result["samples"] = samples
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait()
        for name in ("daemon.log", "lend.log", "tenant.log"):
            path = os.path.join(tmp, name)
            if os.path.exists(path):
                result[name] = open(path).read()[-3000:]
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("tiermem")
    parser.add_argument("out")
    parser.add_argument("--budget-gib", type=int, default=4)
    parser.add_argument("--working-set-gib", type=int, default=12)
    parser.add_argument("--offer-gib", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    results = {"args": vars(args)}
    phases = (("host_only", False, "off", True), ("lent", True, "off", True), ("own_borrow", False, "1", True),
              ("reclaim", True, "off", False))
    for phase, lender, peers, worker in phases:
        results[phase] = run(args, phase, lender, peers, worker)
        r = results[phase]
        print(phase, {k: r.get(k) for k in ("GBps", "verified", "reclaim_s", "reclaimed_bytes", "lend_s")}, flush=True)
    speed = {p: results[p].get("GBps") for p in ("host_only", "lent", "own_borrow")}
    results["ratios"] = {
        "lent_vs_host_only": speed["lent"] / speed["host_only"] if speed["lent"] and speed["host_only"] else None,
        "lent_vs_own_borrow": speed["lent"] / speed["own_borrow"] if speed["lent"] and speed["own_borrow"] else None,
    }
    results["verified"] = all(results[p].get("verified") for p, *_ in phases)
    json.dump(results, open(args.out, "w"), indent=1)
    print(json.dumps(results["ratios"]), "verified", results["verified"])


if __name__ == "__main__":
    main()
