"""Keeps a Flower 1.41 SuperNode connected: the entrypoint of the SuperNode containers (``python <this> args``).

It runs ``flower-supernode args``, echoes its output, and restarts it in the two cases where Flower 1.41 leaves a
SuperNode out of the federation for good (both measured by tests/test_multihost.py):

* activation refused (it logs "Exit Code: 305", Flower's SUPERNODE_CONNECTION_ERROR, and exits with status 1 like
  every Flower error): after a crash the SuperLink still
  counts the node as online until its last heartbeat's patience runs out (2 x 30 s, not configurable), and Docker's
  restart back-off, doubling from 0.1 s, kept the node down for the rest of a short run. Retried every 5 s.
* it gave up on the SuperLink: when the SuperLink restarts, the SuperNode's next request ends in a TLS EOF, which
  Flower's retry rule takes for a handshake error ("SSL/TLS handshake error detected", then "Giving up
  reconnection" when it had retried); it gives up, and the process stays alive but disconnected, so no restart
  policy ever sees it. The supervisor stops it and starts a fresh one after 5 s.

Any other exit is passed on (Docker's restart policy applies); SIGTERM/SIGINT are forwarded, so ``docker compose
stop`` still lets the SuperNode deactivate itself. Standard library only: it runs in Flower's own image.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

# flwr.supercore.exit.ExitCode.SUPERNODE_CONNECTION_ERROR, as flwr_exit logs it (its exit status is 1 for any error)
ACTIVATION_REFUSED = "Exit Code: 305"
GAVE_UP = ("SSL/TLS handshake error detected", "Giving up reconnection")  # what Flower 1.41 logs as it gives up
RETRY_S = 5.0
STOP_GRACE_S = 15.0  # after SIGTERM, a SuperNode that has not exited is killed
PROGRAM = "flower-supernode"


def supervise(argv: list[str], retry_s: float = RETRY_S) -> int:
    """Run ``argv`` until it exits for a reason a restart would not cure; returns that exit status."""
    stopping = False
    child: subprocess.Popen | None = None

    def forward(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        gave_up = refused = False
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            refused = refused or line.rstrip().endswith(ACTIVATION_REFUSED)
            if not gave_up and any(marker in line for marker in GAVE_UP):
                gave_up = True
                say("the SuperNode gave up on the SuperLink but kept running; restarting it")
                child.terminate()
                threading.Timer(STOP_GRACE_S, child.kill).start()
        code = child.wait()
        if stopping:
            return code
        if not (gave_up or refused):
            return code
        if refused:
            say(f"the SuperLink refused activation (after a crash it counts the node online for up to 60 s); "
                f"retrying in {retry_s:g} s")  # fmt: skip
        time.sleep(retry_s)  # also after giving up: a SuperLink that is restarting needs a moment


def say(text: str) -> None:
    print(f"fedvit supervisor: {text}", flush=True)


if __name__ == "__main__":
    sys.exit(supervise([PROGRAM, *sys.argv[1:]]))
