"""The ``tiermem`` command of the Python package: ``tiermem info``, ``demo``, ``bench``,
``daemon``, ``status``, ``top``, ... as the executable built from ``crates/cli`` runs them, run
inside the extension module. ``python -m tiermem ARGS`` does the same."""

import signal
import sys


def main() -> None:
    # As a program of its own: Ctrl-C ends it (Python would only note it while Rust runs).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from tiermem import _tiermem

    argv = ["tiermem", *sys.argv[1:]]
    sys.stdout.flush()
    code = _tiermem.cli_main([sys.executable, "-m", "tiermem"], argv)
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
