"""Processes, locks and journals through real Snakemake runs: nothing left behind, nothing double-booked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from conftest import Journal, fast_config, patience, snakemake, write_config


def journal_files(workflow, server_file: str, cache="results/cache"):
    """One server's journals, one per workflow run."""
    return sorted((workflow / cache / "journal" / server_file).glob("*.jsonl"))


def test_a_damaged_journal_line_costs_a_warning_not_the_next_run(workflow):
    config = fast_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    (journal,) = journal_files(workflow, "tp1-ar")
    text = journal.read_text()
    journal.write_text(text[: len(text) - 20])  # the last line cut short, as by a job killed while it wrote
    lines = len(journal.read_text().splitlines())
    (workflow / "results" / "cells" / "tp1" / "ar" / "short" / "c1.json").unlink()
    snakemake(workflow, "results/cells/tp1/ar/short/c1.json")  # the cell from the cache; the run record again
    log = (workflow / "logs" / "bench" / "tp1-ar.log").read_text()
    assert f"warning: journal {journal.relative_to(workflow)}, line {lines}: damaged" in log
    assert (workflow / "results" / "cells" / "tp1" / "ar" / "short" / "c1.json").exists()


def planned_jobs(workflow, *targets) -> dict[str, int]:
    """{rule: jobs} of a dry run of these targets ({} when nothing is to be done)."""
    out = snakemake(workflow, "-n", *targets).stdout
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:")[1].split("total")[0].splitlines()[3:]
    return {name: int(count) for name, count in (line.split() for line in table if line.strip())}


def test_every_target_downstream_of_a_missing_cell_rebuilds_it(workflow):
    write_config(workflow, fast_config())
    snakemake(workflow, "results/report/report.pdf")  # what the targets below read (the figures are read by none)
    cell = workflow / "results" / "cells" / "tp1" / "dflash" / "short" / "c2.json"
    content = cell.read_text()
    cell.unlink()
    assert planned_jobs(workflow, "results/summary.csv") == {"bench_server": 1, "aggregate": 1}
    assert planned_jobs(workflow, "results/report/report.pdf") == {
        "bench_server": 1,
        "aggregate": 1,
        "report_data": 1,
        "report_pdf": 1,
    }
    assert planned_jobs(workflow, "plan") == {"plan": 1}  # a target that does not read cells measures nothing
    snakemake(workflow, "results/summary.csv")
    assert cell.read_text() == content  # restored from the cache
    assert planned_jobs(workflow, "results/summary.csv") == {}  # and nothing reruns for it again
    record = workflow / "results" / "runs" / "tp1" / "ar.json"
    record.unlink()  # a run record feeds the report, not the tables
    assert planned_jobs(workflow, "results/summary.csv") == {}
    assert planned_jobs(workflow, "results/report/report.pdf") == {
        "bench_server": 1,
        "aggregate": 1,
        "report_data": 1,
        "report_pdf": 1,
    }


def most_at_once(events) -> int:
    """The most servers that held a GPU at the same time, from server_start (with gpus) and server_stop events."""
    held = most = 0
    for event in sorted(events, key=lambda e: e["time"]):
        if event["event"] == "server_start" and event.get("gpus"):
            held += 1
        elif event["event"] == "server_stop":
            held = max(0, held - 1)
        most = max(most, held)
    return most


def test_two_results_folders_on_one_cache_never_double_book_a_gpu_nor_mix_their_records(tmp_path, monkeypatch):
    import tempfile

    from conftest import copy_workflow, server_processes_under
    from specsweep.gpus import GpuPool, lock_folder

    cache = tmp_path / "shared-cache"
    config = fast_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["workloads"][0]["requests"] = 24
    config["cache_dir"] = str(cache)
    config["gpu_pool"] = {"devices": 1}  # a simulated one-GPU host; the locks where every run on it looks
    folders = [copy_workflow(tmp_path / name) for name in ("first", "second")]
    for folder in folders:
        write_config(folder, config)
    host_tmp = tmp_path / "host-tmp"  # the host's temporary folder, for both runs and this test
    host_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
    env = {**os.environ, "TMPDIR": str(host_tmp)}
    logs = [folder / "logs" / "bench" / "tp1-ar.log" for folder in folders]
    runs = []
    try:
        with GpuPool(lock_folder(None), ["0"]).acquire(1, holder="a third workflow"):  # both runs wait for it
            for folder in folders:
                runs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "snakemake", "--cores", "2", "results/summary.csv"],
                        cwd=folder,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
            wait_for(
                lambda: all(log.exists() and "waiting for 1 GPU(s) from the pool" in log.read_text() for log in logs),
                36,
                "both runs waiting for the GPU",
            )
            assert not server_processes_under(tmp_path)
        outputs = [run.communicate(timeout=patience(120))[0] for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert [run.returncode for run in runs] == [0, 0], outputs[1][-3000:]
    events = Journal(tmp_path, "shared-cache").new_events()
    assert most_at_once(events) == 1
    assert len([e for e in events if e["event"] == "measured"]) == 2  # the later run took the first one's cells
    (measuring,) = {e["run"] for e in events if e["event"] == "server_start"}
    files = journal_files(tmp_path, "tp1-ar", "shared-cache")
    assert len(files) == 2  # a journal per run, each with the events of its run only
    for file in files:
        assert {json.loads(line)["run"] for line in file.read_text().splitlines()} == {file.stem}
    measured = sorted(e["cell"] for e in events if e["event"] == "measured" and e["run"] == measuring)
    start, stop = (
        next(e["time"] for e in events if e["event"] == kind and e["run"] == measuring)
        for kind in ("server_start", "server_stop")
    )
    for folder in folders:  # each run record names the one run that measured its cells, and only that run
        record = json.loads((folder / "results" / "runs" / "tp1" / "ar.json").read_text())["latest_run"]
        assert record["run"] == measuring and sorted(record["cells"]) == measured
        assert record["seconds"] == pytest.approx(stop - start)
        cells = sorted(p.relative_to(folder) for p in (folder / "results" / "cells").rglob("*.json"))
        assert [(folders[0] / c).read_text() for c in cells] == [(folder / c).read_text() for c in cells]
    assert server_processes_under(tmp_path) == []


SECRET = "sk-specsweep-kill-test-51c2"


def bench_jobs_under(path):
    """Bench job processes (Snakemake's script for rule bench_server) whose working folder is inside ``path``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if "bench_server.py" in " ".join(proc.info["cmdline"] or []) and (proc.info["cwd"] or "").startswith(
                str(path)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def files_holding(folder, secret: str) -> list:
    return [p for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def wait_for(condition, timeout: float, what: str):
    """``condition()``'s first true value, waited for up to ``patience(timeout)`` (``timeout``: an idle machine's)."""
    deadline = time.monotonic() + patience(timeout)
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {patience(timeout):g} s: {what}")


def start_run(workflow, tmpdir, log):
    env = {**os.environ, "TMPDIR": str(tmpdir), "SPECSWEEP_TEST_KEY": SECRET}
    return subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", "results/summary.csv"],
        cwd=workflow,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def keyed_config(requests: int, startup: float) -> dict:
    config = fast_config(requests=requests, startup=startup, time_scale=1)  # real time: killed mid-start, mid-cell
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["server"] = {"api_key_env": "SPECSWEEP_TEST_KEY", "startup_timeout": 120}
    return config


def measuring(workflow) -> bool:
    log = workflow / "logs" / "bench" / "tp1-ar.log"
    return log.exists() and "cell 1 of 2" in log.read_text()  # the server is ready and a cell under way


def test_a_bench_job_killed_outright_leaves_no_server_and_no_key_file(workflow, tmp_path):
    from conftest import server_processes_under

    tmpdir = tmp_path / "host-tmp"
    tmpdir.mkdir()
    write_config(workflow, keyed_config(requests=4, startup=60))  # killed while its server starts
    run = start_run(workflow, tmpdir, tmp_path / "first.log")
    try:
        wait_for(
            lambda: server_processes_under(workflow) and files_holding(tmpdir, SECRET),
            24,
            "a server starting with its key file",
        )
        (job,) = bench_jobs_under(workflow)
        job.kill()
        run.wait(timeout=patience(24))
        wait_for(lambda: not server_processes_under(workflow), 6, "the server stopped (parent-death signal)")
        assert files_holding(tmpdir, SECRET)  # a SIGKILL runs no code: the file waits for the next start

        write_config(workflow, keyed_config(requests=200, startup=0.1))
        run = start_run(workflow, tmpdir, tmp_path / "second.log")
        wait_for(lambda: measuring(workflow), 24, "the next server measuring")
        assert files_holding(tmpdir, SECRET) == []  # the stale file swept; this server's removed once it was ready
        (job,) = bench_jobs_under(workflow)
        job.kill()  # mid-cell
        run.wait(timeout=patience(24))
        wait_for(lambda: not server_processes_under(workflow), 6, "the server stopped (parent-death signal)")
        assert files_holding(tmpdir, SECRET) == []
    finally:
        for proc in bench_jobs_under(workflow) + server_processes_under(workflow):
            proc.kill()
        run.kill()


def test_snakemake_killed_outright_stops_its_server_jobs(workflow, tmp_path):
    from conftest import server_processes_under

    tmpdir = tmp_path / "host-tmp"
    tmpdir.mkdir()
    write_config(workflow, keyed_config(requests=200, startup=0.1))  # minutes of cells after the kill
    run = start_run(workflow, tmpdir, tmp_path / "run.log")
    try:
        wait_for(lambda: measuring(workflow), 24, "a server measuring")
        run.kill()  # Snakemake alone, as kill -9 <pid> does: its jobs get no signal
        run.wait(timeout=patience(6))
        wait_for(
            lambda: not bench_jobs_under(workflow) and not server_processes_under(workflow),
            6,
            "the orphaned bench job and its server stopped",
        )
        assert files_holding(tmpdir, SECRET) == []
        events = Journal(workflow).new_events()
        assert [e["event"] for e in events if e["event"].startswith("server_")] == ["server_start", "server_stop"]
        assert "the workflow that started this job" in (workflow / "logs" / "bench" / "tp1-ar.log").read_text()
    finally:
        for proc in bench_jobs_under(workflow) + server_processes_under(workflow):
            proc.kill()
