"""Processes, locks and journals through real Snakemake runs: nothing left behind, nothing double-booked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import Journal, fast_config, snakemake, write_config


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
    snakemake(workflow)
    cell = workflow / "results" / "cells" / "tp1" / "dflash" / "short" / "c2.json"
    content = cell.read_text()
    cell.unlink()
    assert planned_jobs(workflow, "results/summary.csv") == {"bench_server": 1, "aggregate": 1}
    assert planned_jobs(workflow, "results/report/report.pdf") == {
        "bench_server": 1, "aggregate": 1, "report_data": 1, "report_pdf": 1}
    assert planned_jobs(workflow, "plan") == {"plan": 1}  # a target that does not read cells measures nothing
    snakemake(workflow, "results/summary.csv")
    assert cell.read_text() == content  # restored from the cache
    assert planned_jobs(workflow, "results/summary.csv") == {}  # and nothing reruns for it again
    record = workflow / "results" / "runs" / "tp1" / "ar.json"
    record.unlink()  # a run record feeds the report, not the tables
    assert planned_jobs(workflow, "results/summary.csv") == {}
    assert planned_jobs(workflow, "results/report/report.pdf") == {
        "bench_server": 1, "aggregate": 1, "report_data": 1, "report_pdf": 1}


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


def test_two_results_folders_on_one_cache_never_double_book_a_gpu_nor_mix_their_records(tmp_path):
    from conftest import copy_workflow, server_processes_under

    cache = tmp_path / "shared-cache"
    config = fast_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["workloads"][0]["requests"] = 24
    config["cache_dir"] = str(cache)
    config["gpu_pool"] = {"devices": 1}  # a simulated one-GPU host; the locks where every run on it looks
    folders = [copy_workflow(tmp_path / name) for name in ("first", "second")]
    for folder in folders:
        write_config(folder, config)
    env = {**os.environ, "TMPDIR": str(tmp_path / "host-tmp")}  # the host's temporary folder, for both runs
    (tmp_path / "host-tmp").mkdir()
    journal = Journal(tmp_path, "shared-cache")
    runs = []
    try:
        for folder in folders:
            if runs:  # the first run holds the GPU before the second starts
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and not any(e["event"] == "server_start"
                                                              for e in journal.new_events()):
                    time.sleep(0.1)
            runs.append(subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", "results/summary.csv"],
                                         cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True))
        outputs = [run.communicate(timeout=600)[0] for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert [run.returncode for run in runs] == [0, 0], outputs[1][-3000:]
    events = Journal(tmp_path, "shared-cache").new_events()
    # the second run asked for the GPU while the first held it, and got it only once the first had let it go
    assert "waiting for 1 GPU(s) from the pool" in (folders[1] / "logs" / "bench" / "tp1-ar.log").read_text()
    assert most_at_once(events) == 1
    assert len([e for e in events if e["event"] == "measured"]) == 2  # the second run took the first run's cells
    (measuring,) = {e["run"] for e in events if e["event"] == "server_start"}
    files = journal_files(tmp_path, "tp1-ar", "shared-cache")
    assert len(files) == 2  # a journal per run, each with the events of its run only
    for file in files:
        assert {json.loads(line)["run"] for line in file.read_text().splitlines()} == {file.stem}
    measured = sorted(e["cell"] for e in events if e["event"] == "measured" and e["run"] == measuring)
    start, stop = (next(e["time"] for e in events if e["event"] == kind and e["run"] == measuring)
                   for kind in ("server_start", "server_stop"))
    for folder in folders:  # each run record names the one run that measured its cells, and only that run
        record = json.loads((folder / "results" / "runs" / "tp1" / "ar.json").read_text())["latest_run"]
        assert record["run"] == measuring and sorted(record["cells"]) == measured
        assert record["seconds"] == pytest.approx(stop - start)
        cells = sorted(p.relative_to(folder) for p in (folder / "results" / "cells").rglob("*.json"))
        assert [(folders[0] / c).read_text() for c in cells] == [(folder / c).read_text() for c in cells]
    assert server_processes_under(tmp_path) == []
