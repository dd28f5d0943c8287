"""The SuperNode supervisor (the SuperNode containers' entrypoint) against a stand-in ``flower-supernode`` that
replays what Flower 1.41 does: refuses activation, gives up on the SuperLink yet stays alive, exits, or is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedvit.app.deployment import supernode_supervisor

# Each start of the stand-in takes the next behaviour from the script's argument list (a counter file tracks it).
STANDIN = """#!/bin/sh
n=$(cat "$COUNTER" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$COUNTER"
behaviour=$(echo "$BEHAVIOURS" | cut -d, -f"$n")
echo "start $n: $behaviour $*"
case "$behaviour" in
  refused) printf 'ERROR: Exit Code: 305\nFailed to initialize the connection to the SuperLink.\n'; exit 1 ;;
  gives-up) echo "WARNING: Giving up reconnection after 0.28 seconds and 2 tries."; trap 'exit 0' TERM; \
            while :; do sleep 0.1; done ;;
  tls-eof) echo "ERROR: SSL/TLS handshake error detected."; trap 'exit 0' TERM; while :; do sleep 0.1; done ;;
  runs) trap 'echo "deactivated"; exit 0' TERM; while :; do sleep 0.1; done ;;
  *) exit "$behaviour" ;;
esac
"""


@pytest.fixture
def standin(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "flower-supernode"
    program.write_text(STANDIN)
    program.chmod(0o755)

    def start(behaviours: str) -> subprocess.Popen:
        env = os.environ | {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "COUNTER": str(tmp_path / "count"),
            "BEHAVIOURS": behaviours,
        }
        code = (
            "from fedvit.app.deployment import supernode_supervisor as s; import sys; "
            "sys.exit(s.supervise(['flower-supernode', '--superlink', 'x:8000'], retry_s=0.05))"
        )
        return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)

    return start


def test_retries_a_refused_activation_then_passes_other_exits_on(standin):
    done = standin("refused,refused,7")
    out, _ = done.communicate(timeout=30)
    assert done.returncode == 7
    assert [line for line in out.splitlines() if line.startswith("start")] == [
        f"start {n}: {b} --superlink x:8000" for n, b in ((1, "refused"), (2, "refused"), (3, "7"))
    ]
    assert out.count("refused activation") == 2


def test_restarts_a_supernode_that_gave_up_but_kept_running(standin):
    done = standin("gives-up,tls-eof,0")
    out, _ = done.communicate(timeout=30)
    assert done.returncode == 0
    assert out.count("gave up on the SuperLink but kept running; restarting it") == 2 and "start 3: 0" in out


def test_sigterm_reaches_the_supernode_and_ends_the_supervisor(standin):
    proc = standin("runs")
    assert proc.stdout.readline().startswith("start 1: runs")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "deactivated" in out and proc.returncode == 0


def test_the_refusal_marker_is_what_flower_logs_for_its_connection_error():
    """flwr_exit logs "Exit Code: <code>" and exits with status 1; the supervisor keys on that line. (In a child
    process: flwr_exit also arms a thread that would end the test run.)"""
    code = (
        "from flwr.supercore.exit import ExitCode, flwr_exit; "
        "flwr_exit(ExitCode.SUPERNODE_CONNECTION_ERROR, 'test', emit_telemetry=False)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).splitlines()
    assert any(line.rstrip().endswith(supernode_supervisor.ACTIVATION_REFUSED) for line in lines), lines
