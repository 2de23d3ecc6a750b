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
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time

RUN_ENV = "SPECSWEEP_RUN"
HEARTBEAT_ENV = "SPECSWEEP_HEARTBEAT"  # {path}:{timeout seconds}, set by ``start`` for the jobs


def new_run_id() -> str:
    """{UTC start time}-{host}-{pid}: sortable by start, unique per host and process, safe as a file name."""
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname()) or "host"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{host}-{os.getpid()}"


def start(heartbeat_folder: str | None = None, orphan_timeout: float = 300.0) -> str:
    """Name a new run for this process and the jobs it starts (the workflow's main process calls it); with a
    ``heartbeat_folder``, keep a heartbeat file there for as long as this process lives (removed at its exit)."""
    os.environ[RUN_ENV] = new_run_id()
    if heartbeat_folder is not None:
        path = os.path.join(os.path.abspath(heartbeat_folder), f"{os.environ[RUN_ENV]}.alive")
        try:
            _keep_heartbeat(path, orphan_timeout / 10)
        except OSError:  # the cache folder's own check names the problem; the jobs then watch their parent alone
            return os.environ[RUN_ENV]
        os.environ[HEARTBEAT_ENV] = f"{path}:{orphan_timeout:g}"
    return os.environ[RUN_ENV]


def _keep_heartbeat(path: str, period: float) -> threading.Thread:
    """Touch ``path`` now and every ``period`` seconds from a daemon thread; remove it when this process exits."""
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def touch() -> None:
        with open(path, "a"):
            pass
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
