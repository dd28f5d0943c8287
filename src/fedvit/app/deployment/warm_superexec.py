"""``fedvit-superexec``: Flower's SuperExec with a warm executor that forks each ClientApp task.

Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message, and a fresh interpreter pays torch,
timm, torchvision, datasets and flwr imports (~10 s on 2 CPU cores) before the handler runs. This command runs
Flower's own ``flower-superexec`` (same flags, same task loop) after importing those third-party modules once,
and hands SuperExec an executor (Flower's ``Executor`` protocol, the seam it passes every task through) whose
``launch`` forks a child that runs Flower's ``run_clientapp`` for the task. The child starts with the imports
done; it loads the app (fedvit's own packages) from the FAB as a fresh process would, since the parent never
imports them.

Forking is safe here because the parent only imports: it runs no torch operation (no OpenMP pool) and never
touches a GPU (CUDA cannot be initialised before a fork), and each child re-seeds the global random generators
as a fresh interpreter would. The only Flower values changed (in this process and so in its children, never in
Flower's files): the retry delays and try limit of a task's object pull (below). Where forking is not safe or
not possible, tasks go to Flower's subprocess executor (the lean cold start): other task types (the ServerApp),
runtime dependency installation (the task would run in another environment than the preloaded one), and
platforms without ``os.fork``.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import time
import traceback
from logging import INFO, WARNING

PRELOAD_ENV = "FEDVIT_SUPEREXEC_PRELOAD"
# A task's process pulls its message's objects from the SuperNode, which creates the task before it has pulled
# them from the SuperLink itself (one HTTPS request per object: 0.4-4.3 s for the tiny model's ~70 objects on a
# busy 2-core machine). Flower's child then retries after 1 s, 2 s, 4 s ... (``PULL_INITIAL_BACKOFF``/``_CAP``,
# fixed default arguments of ``pull_and_inflate_object_from_tree``), so it starts up to twice as late as the
# message arrived. Forked children retry after INITIAL, doubling to CAP; the number of tries is left to Flower's
# overall limit on the pull (``PULL_MAX_TIME``, 2 h) so that a slow transfer of a big model is never cut short.
PULL_BACKOFF_ENV = {"initial": "FEDVIT_PULL_INITIAL_BACKOFF", "cap": "FEDVIT_PULL_BACKOFF_CAP"}
DEFAULT_PULL_BACKOFF_S = {"initial": 0.05, "cap": 0.2}


PROJECT_PACKAGES = ("fedvit", "benchmarks")  # never preloaded; only fedvit's own modules are ever dropped
# What a ClientApp task imports that is not the app itself (see benchmarks/deployment_latency.py).
DEFAULT_PRELOAD = (
    "torch",
    "torchvision",
    "timm",
    "numpy",
    "scipy.optimize",
    "safetensors.numpy",
    "datasets",
    "flwr_datasets.partitioner",
    "flwr.clientapp",
    "flwr.supernode.runtime.run_clientapp",
)


def preload(modules: list[str]) -> float:
    """Import ``modules`` (names; an unknown one is reported, not fatal); returns the seconds it took."""
    from flwr.supercore import log

    start = time.perf_counter()
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            log(WARNING, "fedvit-superexec: cannot preload %s (%s); tasks import it themselves", name, err)
    return time.perf_counter() - start


def pull_backoff() -> tuple[float, float]:
    """(initial, cap) retry delays in seconds from the environment (0.001 to 10 each, initial <= cap), else the
    defaults; a bad value stops the command."""
    values = {}
    for key, name in PULL_BACKOFF_ENV.items():
        raw = os.environ.get(name, "")
        try:
            values[key] = float(raw) if raw else DEFAULT_PULL_BACKOFF_S[key]
        except ValueError:
            values[key] = -1.0
        if not 0.001 <= values[key] <= 10:
            raise SystemExit(f"fedvit-superexec: {name}={raw!r} must be a number of seconds from 0.001 to 10")
    if values["initial"] > values["cap"]:
        raise SystemExit(f"fedvit-superexec: {PULL_BACKOFF_ENV['initial']} must not exceed {PULL_BACKOFF_ENV['cap']}")
    return values["initial"], values["cap"]


def set_object_pull_backoff(initial: float, cap: float) -> dict | None:
    """Make Flower's task-input object pull in this process (and the children it forks) retry after ``initial``
    seconds, doubling up to ``cap``, for as long as Flower's time limit allows; returns Flower's previous settings,
    or None when its function no longer has these keywords (then nothing changes)."""
    from flwr.supercore.inflatable import inflatable_utils

    pull = inflatable_utils.pull_and_inflate_object_from_tree
    defaults = dict(pull.__kwdefaults__ or {})
    keys = ("initial_backoff", "backoff_cap", "max_tries_per_object")
    if not all(k in defaults for k in keys):
        return None
    pull.__kwdefaults__ = defaults | {"initial_backoff": initial, "backoff_cap": cap, "max_tries_per_object": None}
    return {k: defaults[k] for k in keys}


class ForkExecutor:
    """Flower ``Executor`` that forks ClientApp tasks from this warm process; anything else goes to ``fallback``."""

    def __init__(self, fallback) -> None:
        self.fallback = fallback
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (task id, start time)

    def get_eligible_capacity(self, supported_task_types, **kwargs):
        return self.fallback.get_eligible_capacity(supported_task_types, **kwargs)

    def wait_for_capacity(self, task_type=None, **kwargs) -> None:
        self.fallback.wait_for_capacity(task_type, **kwargs)

    def launch(self, spec):
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP or spec.runtime_dependency_install or not hasattr(os, "fork"):
            return self.fallback.launch(spec)
        try:
            pid = os.fork()
        except OSError as err:
            return LaunchResult.failed(f"fork failed: {err}")
        if pid == 0:  # the task's process: never returns into SuperExec's loop
            os._exit(run_forked_clientapp(spec))
        self.children[pid] = (spec.task_id, time.monotonic())
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished children (Flower's loop calls this between task polls) and log each one's time."""
        from flwr.supercore import log

        for pid, (task_id, started) in list(self.children.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                del self.children[pid]
                code = os.waitstatus_to_exitcode(status)
                log(INFO, "fedvit-superexec: task %d took %.2f s (exit %d)", task_id, time.monotonic() - started, code)
        self.fallback.reconcile()

    def close(self) -> None:
        self.fallback.close()


def run_forked_clientapp(spec) -> int:
    """In the forked child: what ``flwr-clientapp`` does for one task; returns its exit code."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    sys.argv = ["flwr-clientapp", "--token", "***"]
    for name in [m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES]:
        del sys.modules[name]  # this command's own package: each task imports fedvit afresh, as a new process
    random.seed()  # fresh global generators, as a new interpreter has (fedvit itself draws only from seeded ones)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    try:
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
            parent_pid=spec.parent_pid,
            runtime_dependency_install=spec.runtime_dependency_install,
        )
    except SystemExit as done:  # flwr_exit ends the task with sys.exit(code)
        return done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never fall back into the parent's loop
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def main() -> None:
    """``fedvit-superexec``: ``flower-superexec`` with the warm fork executor (same command-line flags)."""
    from flwr.supercore import log

    names = [n.strip() for n in os.environ.get(PRELOAD_ENV, ",".join(DEFAULT_PRELOAD)).split(",") if n.strip()]
    seconds = preload(names)
    log(INFO, "fedvit-superexec: preloaded %d modules in %.1f s; ClientApp tasks are forked", len(names), seconds)
    initial, cap = pull_backoff()
    if set_object_pull_backoff(initial, cap) is None:
        log(WARNING, "fedvit-superexec: this Flower has no object-pull backoff to set; tasks keep Flower's delays")
    else:
        log(INFO, "fedvit-superexec: a task's object pull retries after %.3f s, doubling to %.3f s", initial, cap)

    # The module (import_module returns sys.modules' entry; the package attribute of that name is the function).
    superexec = importlib.import_module("flwr.supercore.superexec.run_superexec")
    flower_get_executor = superexec.get_executor

    def warm_get_executor(executor_type, *args, **kwargs):
        from flwr.supercore.constant import ExecutorType

        executor = flower_get_executor(executor_type, *args, **kwargs)
        return ForkExecutor(executor) if executor_type == ExecutorType.SUBPROCESS else executor

    superexec.get_executor = warm_get_executor  # the executor seam: run_superexec asks get_executor for it
    from flwr.supercore.cli import flower_superexec

    sys.argv[0] = "flower-superexec"
    flower_superexec()


if __name__ == "__main__":
    main()
