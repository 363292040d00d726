"""The ``tiermem`` command the wheel installs: the same program as the executable, run inside
the extension module, on the simulated device here."""

import importlib.metadata
import os
import subprocess
import sys


def tiermem(*args, **env):
    environment = {**os.environ, "TIERMEM_BACKEND": "sim", **env}
    return subprocess.run([sys.executable, "-m", "tiermem", *args], capture_output=True, text=True,
                          env=environment, timeout=300)


def test_the_wheel_declares_the_tiermem_command():
    scripts = importlib.metadata.entry_points(group="console_scripts", name="tiermem")
    assert [s.value for s in scripts] == ["tiermem.__main__:main"]


def test_info_runs_on_the_simulated_device_and_says_so():
    out = tiermem("info", TIERMEM_SIM_GPUS="2", TIERMEM_PEERS="auto")  # whatever the caller's environment says
    assert out.returncode == 0, out.stderr
    assert "backend          sim" in out.stdout, out.stdout
    assert "GPU 1 lends" in out.stdout, out.stdout


def test_a_bad_command_line_is_a_clear_error_and_a_failure():
    out = tiermem("no-such-command")
    assert out.returncode != 0
    assert "no-such-command" in out.stderr, out.stderr


def test_a_failing_command_exits_non_zero_with_its_message():
    out = tiermem("demo", "--rounds", "2", TIERMEM_HBM_LIMIT="100TiB")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "tiermem:" in out.stderr, out.stderr


def test_helpers_start_the_same_program_again():
    # `bench tenants` starts the daemon and its workers as the running program does: here
    # `python -m tiermem`, not the Python interpreter alone.
    out = tiermem("bench", "tenants", "--help")
    assert out.returncode == 0, out.stderr
    assert "tenants" in out.stdout
