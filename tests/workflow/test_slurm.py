"""The workflow on a real one-node SLURM cluster through snakemake-executor-plugin-slurm and profiles/slurm.

The cluster (tests/slurm_cluster.py) has no accounting database, so the run
adds what a user of such a cluster sets: ``--slurm-status-command squeue``
(the plugin's default asks ``sacct``, which fails there) and a short first
status check. Everything else comes from the project's profile.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import (
    REPO,
    Journal,
    assert_no_process_left,
    copy_workflow,
    fast_config,
    patience,
    processes_started_in,
    write_config,
)
from slurm_cluster import Cluster, missing


pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

NO_ACCOUNTING = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2"]


def run(workdir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Snakemake through the profile, stopped after ``patience(timeout)`` (``timeout``: an idle machine's time)."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *NO_ACCOUNTING, *args],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=patience(timeout),
    )
    assert proc.returncode == 0, proc.stdout[-8000:]
    return proc


def bench_jobs(cluster: Cluster, after: int = 0) -> dict[str, dict]:
    """The cluster's bench_server jobs with an id above ``after``, by server name (tp1/ar)."""
    jobs = {}
    for job in cluster.jobs():
        match = re.fullmatch(r"rule_bench_server_wildcards_(\d+)_(.+)", job.get("Comment", ""))
        if match and int(job["JobId"]) > after:
            jobs[f"tp{match[1]}/{match[2]}"] = job
    return jobs


def wait_until_ended(cluster: Cluster, after: int, folder: Path, ending: float, what: str) -> dict[str, str]:
    """Wait (at most ``patience(ending)``) until the bench jobs with an id above ``after`` have ended and no process
    started in ``folder`` (Snakemake, batch script, job step, bench script, server) is left; their states by server.
    Processes still there at the limit fail the test, named, and are killed."""
    deadline = time.monotonic() + patience(ending)
    while True:
        states = {name: job["JobState"] for name, job in bench_jobs(cluster, after=after).items()}
        left = processes_started_in(folder)
        running = {"RUNNING", "PENDING", "COMPLETING", "CONFIGURING"} & set(states.values())
        if not running and not left:
            return states
        if time.monotonic() > deadline:
            assert not running, f"{what}: jobs {states}"
            assert_no_process_left(folder, grace=0)
        time.sleep(0.5)


def read_lines(proc: subprocess.Popen, lines: list[str]) -> None:
    for line in proc.stdout or ():
        lines.append(line)


def as_in_a_terminal() -> None:
    """In the child before it runs Snakemake: SIGINT's default disposition, as a shell in a terminal gives a command.
    The tests may run under a shell that started them in the background, which ignores SIGINT, and an ignored signal
    is inherited: Python then installs no KeyboardInterrupt handler and Snakemake never sees the Ctrl-C (seen as a
    run that went on to its end after three presses)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def press_ctrl_c(proc: subprocess.Popen, lines: list[str], presses: int = 3) -> None:
    """SIGINT to Snakemake, again (as a user presses Ctrl-C again) while it has not said it is terminating, at most
    ``presses`` times: a SIGINT that lands while Snakemake's main thread is inside one of its short asyncio runs (it
    makes one per job it finishes) is taken by asyncio's own handler, which only cancels that run's task, and is
    lost when the task ends first."""
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + patience(2)
        while time.monotonic() < deadline and proc.poll() is None:
            if any("Terminating processes on user request" in line for line in list(lines)):
                return
            time.sleep(0.2)
        if proc.poll() is not None:
            return


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "cluster", gpus=4).start()
    yield c
    c.stop()


@pytest.mark.long(2.8)
def test_workflow_through_slurm(cluster, tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    shutil.copytree(REPO / "profiles", workdir / "profiles")
    # real time: each server lives at least 8 s, enough for two SLURM jobs to meet, and its cells of 400 tokens
    # long enough to interrupt
    config = fast_config(startup=8.0, time_scale=1)
    config["tp"] = [1, 2]
    config["gpu_pool"] = {"devices": 4}
    config["cache_dir"] = str(tmp_path / "shared" / "cells")  # a path every node sees
    write_config(workdir, config)
    journal = Journal(workdir, config["cache_dir"])

    # 1. the whole run: every cell and the PDF, each server a SLURM job asking for its TP size in GPUs
    run(workdir)
    cells = sorted((workdir / "results" / "cells").rglob("*.json"))
    assert len(cells) == 2 * 2 * 2  # tp x method x concurrency
    assert (workdir / "results" / "report" / "report.pdf").read_bytes().startswith(b"%PDF")
    jobs = bench_jobs(cluster)
    assert sorted(jobs) == ["tp1/ar", "tp1/dflash", "tp2/ar", "tp2/dflash"]
    for name, job in jobs.items():
        assert job["JobState"] == "COMPLETED"
        assert job["TresPerJob"] == f"gres:gpu:{name[2]}", job

    # servers got GPUs among those SLURM granted their job, and servers up at the same time got disjoint ones
    events = journal.new_events()
    spans, offered = {}, {}
    for e in events:
        if e["event"] == "server_start":
            spans[e["server"]] = [e["time"], None, set(e["gpus"])]
            offered[e["server"]] = e["offered"]
        elif e["event"] == "server_stop":
            spans[e["server"]][1] = e["time"]
    assert sorted(spans) == sorted(jobs)
    for name, (_, _, gpus) in spans.items():
        # SLURM granted each job exactly its TP size (CUDA_VISIBLE_DEVICES), and the pool took those
        assert len(offered[name]) == int(name[2]) and gpus == set(offered[name]), (name, gpus, offered[name])
    overlapping = [
        (a, b) for a in spans for b in spans if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]
    ]
    assert overlapping, f"no two servers ran at the same time: {spans}"
    for a, b in overlapping:
        assert not spans[a][2] & spans[b][2], (a, b, spans[a], spans[b])
    # two concurrent server jobs wrote their cells into the shared cache
    cached = [p for p in (tmp_path / "shared" / "cells").rglob("*.json") if p.parent.name != "plan"]  # not the plan's
    assert len(cached) == len(cells)

    # 2. a rerun after deleting one cell: exactly one SLURM job, served from the shared cache, no server started
    last = max(int(j["JobId"]) for j in cluster.jobs())
    deleted = "results/cells/tp1/ar/short/c1.json"
    (workdir / deleted).unlink()
    run(workdir, deleted)
    new_jobs = [j for j in cluster.jobs() if int(j["JobId"]) > last]
    assert [j["Comment"] for j in new_jobs] == ["rule_bench_server_wildcards_1_ar"], new_jobs
    events = journal.new_events()
    assert events and {e["event"] for e in events} == {"cache_hit"}, events
    assert (workdir / deleted).exists()

    # 3. Ctrl-C while servers run: snakemake cancels its SLURM jobs and no server is left
    last = max(int(j["JobId"]) for j in cluster.jobs())
    config["workloads"][0]["max_new_tokens"] = 400  # new cells (not cached), long enough to interrupt
    write_config(workdir, config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *NO_ACCOUNTING],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=as_in_a_terminal,
    )
    lines: list[str] = []  # its output as it comes (read by a thread): whether it has said it is terminating
    reader = threading.Thread(target=read_lines, args=(proc, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + patience(30)
        while not any(e["event"] == "server_start" for e in journal.new_events()):
            assert time.monotonic() < deadline and proc.poll() is None, "no server started under SLURM"
            time.sleep(0.5)
        press_ctrl_c(proc, lines)
        proc.wait(timeout=patience(20))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
    out = "".join(lines)
    interrupted = bench_jobs(cluster, after=last)
    assert interrupted, out[-4000:]
    # the cancelled jobs end, and with them every process they ran (batch script, job step, server), within
    # SLURM's KillWait (5 s) and a server's stop
    states = wait_until_ended(cluster, last, tmp_path, 15, "after Ctrl-C")
    assert set(states.values()) <= {"CANCELLED", "COMPLETED"} and "CANCELLED" in states.values(), (states, out[-4000:])

    # 4. Snakemake killed outright on the login node (SIGKILL: it cancels nothing): its SLURM jobs are the cluster's,
    # so their parent lives on; they stop their servers once the workflow's heartbeat has been still for the timeout
    last = max(int(j["JobId"]) for j in cluster.jobs())
    config["server"] = {**config.get("server", {}), "orphan_timeout": 6}
    config["workloads"][0]["max_new_tokens"] = 2000  # minutes of cells: only the heartbeat's silence ends them soon
    write_config(workdir, config)
    journal.new_events()
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *NO_ACCOUNTING],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + patience(30)
        while not any(e["event"] == "server_start" for e in journal.new_events()):
            assert time.monotonic() < deadline and proc.poll() is None, "no server started under SLURM"
            time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait()
    killed = bench_jobs(cluster, after=last)
    assert killed
    # each job ends by itself (its server stopped, the bench job failed): its job step's Snakemake, the batch script
    # and srun exit too; nothing of the run is left, though nothing cancelled the jobs
    states = wait_until_ended(cluster, last, tmp_path, 30, "after SIGKILL")  # the 6 s timeout, then each stop
    stopped = [
        name
        for name in states
        if "has not touched" in (workdir / "logs" / "bench" / f"{name.replace('/', '-')}.log").read_text()
    ]
    assert stopped, states
