"""Cancelled SLURM jobs against processes left behind: Ctrl-C rounds through the one-node test cluster.

    sudo .venv/bin/python benchmarks/slurm_cancel_rounds.py --rounds 14      # root, SLURM installed (tools/test.sh)

Each round starts the workflow through profiles/slurm (two TP sizes, two methods: four bench jobs on four GPUs),
sends Snakemake SIGINT once a server has started (it cancels its jobs: SLURM sends SIGTERM to every process of
them), waits until every job has ended, then lists the processes of the run still alive 15 s later: Snakemake, batch
scripts, job steps, scripts, servers. Where py-spy is installed each one's stack is printed, then it is killed. Run it
beside busy loops (`yes > /dev/null &`, one per core and more) for the load the test suite meets.

Before the job step's SIGTERM handler ran off the main thread (rules/common.smk), 4 rounds of 14 left a job step's
Snakemake asleep in JobScheduler.exit_gracefully, its batch shell gone.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from conftest import Journal, copy_workflow, fast_config, processes_started_in, write_config  # noqa: E402
from slurm_cluster import Cluster, missing  # noqa: E402

NO_ACCOUNTING = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2"]


def one_round(cluster: Cluster, workdir: Path, base: Path, config: dict, journal: Journal) -> list[str]:
    """One Ctrl-C round; the processes of the run left 15 s after its jobs ended (killed), described."""
    subprocess.run([sys.executable, "-m", "snakemake", "--unlock", "--cores", "1"], cwd=workdir, capture_output=True)
    write_config(workdir, config)
    journal.new_events()
    last = max((int(j["JobId"]) for j in cluster.jobs()), default=0)
    run = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *NO_ACCOUNTING],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while not any(e["event"] == "server_start" for e in journal.new_events()):
        if run.poll() is not None:
            raise SystemExit(f"the run ended ({run.returncode}) before a server started")
        time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    run.wait()
    while any(int(j["JobId"]) > last and j["JobState"] in ("RUNNING", "PENDING", "COMPLETING") for j in cluster.jobs()):
        time.sleep(0.5)
    time.sleep(15)
    left = []
    for proc in processes_started_in(base):
        left.append(f"{proc.pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:200]}")
        if shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists():
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            subprocess.run([spy, "dump", "--pid", str(proc.pid)])
        proc.kill()
    return left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=14)
    args = parser.parse_args()
    if missing():
        raise SystemExit(missing())
    base = Path(tempfile.mkdtemp(prefix="specsweep-cancel-rounds-"))
    cluster = Cluster(base / "cluster", gpus=4).start()
    try:
        workdir = copy_workflow(base / "wf")
        shutil.copytree(REPO / "profiles", workdir / "profiles")
        config = fast_config(startup=8.0, time_scale=1)
        config.update(tp=[1, 2], gpu_pool={"devices": 4}, cache_dir=str(base / "shared" / "cells"))
        journal = Journal(workdir, config["cache_dir"])
        with_left = 0
        for n in range(args.rounds):
            config["workloads"][0]["max_new_tokens"] = 2000 + n  # new cells every round
            left = one_round(cluster, workdir, base, config, journal)
            with_left += bool(left)
            print(f"round {n + 1}: {len(left)} process(es) left" + "".join(f"\n  {d}" for d in left), flush=True)
        print(f"{with_left} of {args.rounds} rounds left processes behind")
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
