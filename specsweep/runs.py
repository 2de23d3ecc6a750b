"""A workflow run: the id every job of one Snakemake invocation shares, and a job's watch on the workflow.

The workflow's main process names its run once (``start``, from rules/common.smk) in the environment, which its
jobs inherit, on this host and, through sbatch, on a cluster's nodes. Journals are kept per run and every event
names its run, so that two runs on one cache (two results folders, two hosts) never mix their records.

A job whose workflow is gone (Snakemake killed with SIGKILL: it runs no code to stop its jobs) stops itself
(``stop_with_parent``): its server would otherwise run on as an orphan for hours.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

RUN_ENV = "SPECSWEEP_RUN"


def new_run_id() -> str:
    """{UTC start time}-{host}-{pid}: sortable by start, unique per host and process, safe as a file name."""
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname()) or "host"
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{host}-{os.getpid()}"


def start() -> str:
    """Name a new run for this process and the jobs it starts (the workflow's main process calls it)."""
    os.environ[RUN_ENV] = new_run_id()
    return os.environ[RUN_ENV]


def current() -> str:
    """This process's run: the workflow's, else (a job started outside a workflow) a run of its own."""
    return os.environ.get(RUN_ENV) or start()


def stop_with_parent(poll: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM (which a bench job turns into stopping its server) once the process that started
    it has exited, checked every ``poll`` seconds by a daemon thread: an orphan is adopted by another process."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        try:
            print(
                f"the workflow that started this job (process {parent}) is gone: stopping", file=sys.stderr, flush=True
            )
        except (OSError, ValueError):  # its console may have gone with it
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="stop-with-parent", daemon=True)
    thread.start()
    return thread
