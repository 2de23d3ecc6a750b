"""A workflow run: the id every job of one Snakemake invocation shares, and a job's watch on the workflow.

The workflow's main process names its run once (``start``, from rules/common.smk) in the environment, which its
jobs inherit, on this host and, through sbatch, on a cluster's nodes. Journals are kept per run and every event
names its run, so that two runs on one cache (two results folders, two hosts) never mix their records.

A job whose workflow is gone (Snakemake killed with SIGKILL: it runs no code to stop its jobs) stops itself
(``stop_with_workflow``): its server would otherwise run on as an orphan for hours. On this host the job sees its
parent go. A cluster job's parent is the cluster's job step, which lives on after the workflow, so the main process
also touches a heartbeat file (``{cache_dir}/runs/{run}.alive``, on the storage every node shares) every tenth of
``server.orphan_timeout``; a job that sees that file unchanged for the whole timeout stops. The job measures the
silence on its own monotonic clock, never by comparing the file's time with its own: node clocks may disagree.

A run killed outright leaves its heartbeat file behind; the next run on the cache removes it (``sweep_heartbeats``)
once it has been still for many times its run's timeout (written in the file) and its run is not a live process on
this host. That age dwarfs any disagreement of clocks, and a run it misjudges loses nothing: its jobs have stopped by
then, and a live run writes its file again at its next beat.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

RUN_ENV = "SPECSWEEP_RUN"
HEARTBEAT_ENV = "SPECSWEEP_HEARTBEAT"  # {path}:{timeout seconds}, set by ``start`` for the jobs
HEARTBEAT_SUFFIX = ".alive"
STALE_TIMEOUTS = 10  # a heartbeat file still for this many of its run's timeouts (a hundred beats) is a dead run's


def new_run_id() -> str:
    """{UTC start time}-{host}-{pid}: sortable by start, unique per host and process, safe as a file name."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{_host()}-{os.getpid()}"


def _host() -> str:
    """This host's name as run ids hold it (safe as a file name)."""
    return "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname()) or "host"


def start(heartbeat_folder: str | None = None, orphan_timeout: float = 300.0) -> str:
    """Name a new run for this process and the jobs it starts (the workflow's main process calls it); with a
    ``heartbeat_folder``, keep a heartbeat file there for as long as this process lives (removed at its exit) and
    remove the files there of runs that died without removing theirs."""
    os.environ[RUN_ENV] = new_run_id()
    if heartbeat_folder is not None:
        folder = os.path.abspath(heartbeat_folder)
        path = os.path.join(folder, f"{os.environ[RUN_ENV]}{HEARTBEAT_SUFFIX}")
        try:
            _keep_heartbeat(path, orphan_timeout)
        except OSError:  # the cache folder's own check names the problem; the jobs then watch their parent alone
            return os.environ[RUN_ENV]
        os.environ[HEARTBEAT_ENV] = f"{path}:{orphan_timeout:g}"
        sweep_heartbeats(folder, orphan_timeout)
    return os.environ[RUN_ENV]


def _keep_heartbeat(path: str, timeout: float) -> threading.Thread:
    """Write ``path`` (its text: the run's ``timeout``, for ``sweep_heartbeats`` of a later run) and touch it every
    tenth of ``timeout`` from a daemon thread; remove it when this process exits."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    period = timeout / 10

    def touch() -> None:
        with open(path, "a") as file:
            if file.tell() == 0:  # new, or written again after another run removed it
                file.write(f"{timeout:g}\n")
        os.utime(path)

    def beat() -> None:
        while True:
            time.sleep(period)
            try:
                touch()
            except OSError:  # shared storage away for a moment: the jobs' timeout covers many periods
                pass

    def remove() -> None:
        try:
            os.remove(path)
        except OSError:
            pass

    touch()
    atexit.register(remove)
    thread = threading.Thread(target=beat, name="workflow-heartbeat", daemon=True)
    thread.start()
    return thread


def sweep_heartbeats(folder: str, timeout: float) -> list[str]:
    """Remove the heartbeat files in ``folder`` of runs that ended without removing theirs (Snakemake killed with
    SIGKILL): a file unchanged for STALE_TIMEOUTS times its run's timeout (its text; ``timeout`` where it cannot be
    read) whose run is not a live process on this host. Returns the paths removed."""
    removed: list[str] = []
    now = time.time()
    try:
        names = [n for n in os.listdir(folder) if n.endswith(HEARTBEAT_SUFFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path) as file:
                text = file.read(64)
            age = now - os.stat(path).st_mtime
        except OSError:  # removed meanwhile, or not readable: not this run's to judge
            continue
        try:
            run_timeout = float(text)
        except ValueError:
            run_timeout = timeout
        if not (math.isfinite(run_timeout) and run_timeout > 0):
            run_timeout = timeout
        if age > STALE_TIMEOUTS * run_timeout and not _alive_here(name[: -len(HEARTBEAT_SUFFIX)]):
            try:
                os.remove(path)
            except OSError:
                continue
            removed.append(path)
    return removed


def _alive_here(run: str) -> bool:
    """Whether ``run`` (an id of ``new_run_id``) is a live process on this host; a run of another host counts as not
    (its file's age alone decides)."""
    host, _, pid = run.partition("-")[2].rpartition("-")
    if host != _host() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def off_the_main_thread(handler: Callable[..., object]) -> Callable[..., None]:
    """A signal handler that runs ``handler`` (its arguments passed on) on a daemon thread of its own.

    Python runs a signal handler on the main thread, between two of its steps: a handler that takes a lock the main
    thread holds at that moment waits on itself for ever. Snakemake 9's SIGTERM handler takes its scheduler's lock,
    which the main thread holds while it handles a failed job; SLURM sends SIGTERM to every process of a job it
    cancels, and a job step's Snakemake caught there never exited. On its own thread the handler waits until the main
    thread lets the lock go."""

    @functools.wraps(handler)
    def handle(*args: object) -> None:
        threading.Thread(target=handler, args=args, name=f"signal-{handler.__name__}", daemon=True).start()

    handle.off_the_main_thread = True  # type: ignore[attr-defined]
    return handle


def current() -> str:
    """This process's run: the workflow's, else (a job started outside a workflow) a run of its own."""
    return os.environ.get(RUN_ENV) or start()


def _heartbeat() -> tuple[str, float] | None:
    """The workflow's heartbeat file and timeout from this job's environment, if its workflow keeps one."""
    value = os.environ.get(HEARTBEAT_ENV, "")
    path, _, timeout = value.rpartition(":")
    try:
        return (path, float(timeout)) if path else None
    except ValueError:
        return None


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def stop_with_workflow(poll: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM (which a bench job turns into stopping its server) once the workflow that started
    it is gone, checked every ``poll`` seconds by a daemon thread: its parent process has exited (an orphan is
    adopted by another process), or the workflow's heartbeat file has not changed for its timeout."""
    parent = os.getppid()
    heartbeat = _heartbeat()

    def gone() -> str | None:
        if os.getppid() != parent:
            return f"the workflow that started this job (process {parent}) is gone"
        if heartbeat is None:
            return None
        mtime = _mtime(heartbeat[0])
        if mtime != seen[0]:
            seen[0], seen[1] = mtime, time.monotonic()
        elif time.monotonic() - seen[1] > heartbeat[1]:
            return f"the workflow that started this job has not touched {heartbeat[0]} for {heartbeat[1]:g} s"
        return None

    seen: list = [_mtime(heartbeat[0]) if heartbeat else None, time.monotonic()]

    def watch() -> None:
        while (reason := gone()) is None:
            time.sleep(poll)
        try:
            print(f"{reason}: stopping", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # its console may have gone with it
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="stop-with-workflow", daemon=True)
    thread.start()
    return thread
