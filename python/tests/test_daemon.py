"""A Pool leases its HBM from the node daemon when one runs (TIERMEM_DAEMON): it starts within
the budget the daemon gives, and its lease ends when it is collected. Needs the `tiermem`
program (built by `cargo build`; CI builds it before these tests); skipped without it."""

import gc
import json
import os
import pathlib
import subprocess
import time

import pytest

import tiermem

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAM = next(
    (p for p in [os.environ.get("TIERMEM_BIN"), ROOT / "target/release/tiermem", ROOT / "target/debug/tiermem"]
     if p and pathlib.Path(p).is_file()),
    None,
)


def status(program, socket):
    out = subprocess.run([program, "status", "--json", "--socket", socket], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_for(condition, what, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.skipif(PROGRAM is None, reason="no tiermem program built (cargo build --bin tiermem)")
def test_a_pool_leases_its_budget_from_the_daemon(tmp_path, monkeypatch):
    socket = str(tmp_path / "tiermemd.sock")
    config = tmp_path / "tiermemd.toml"
    config.write_text('[[gpu]]\nindex = 0\nhbm = "24MiB"\n')
    daemon = subprocess.Popen([str(PROGRAM), "daemon", "--config", str(config), "--socket", socket],
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: status(PROGRAM, socket) is not None, "the daemon")
        monkeypatch.setenv("TIERMEM_DAEMON", socket)
        pool = tiermem.Pool(backend="sim", hbm_limit="64MiB", host_limit="64MiB")
        assert pool.hbm_cap == 24 << 20, "it starts within the daemon's budget"
        buf = pool.alloc("8MiB")
        data = bytes(range(256)) * (8 << 12)
        buf.write(data)
        assert buf.read() == data
        wait_for(lambda: len(status(PROGRAM, socket)["tenants"]) == 1, "the pool to be a tenant")
        del buf, pool
        gc.collect()
        wait_for(lambda: status(PROGRAM, socket)["tenants"] == [], "the lease to end with the pool")
    finally:
        daemon.kill()
        daemon.wait()
