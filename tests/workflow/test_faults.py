"""The fault matrix through real Snakemake runs: nothing lost, nothing left running, every error explained."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest
import requests

from conftest import fast_config, Journal, patience, server_processes_under, snakemake, write_config
from specsweep.cache import CellCache
from specsweep.counters import parse_prometheus
from specsweep.report import Tables


def no_partial_files(workflow):
    assert not list((workflow / "results").rglob("*.tmp"))
    assert not list((workflow / "results").rglob(".*.tmp"))


def failure_records(workflow):
    return {
        str(p.relative_to(workflow)): json.loads(p.read_text())
        for p in (workflow / "results" / "failed").rglob("*.json")
    }


def test_server_fails_to_start(workflow):
    write_config(workflow, fast_config(crash_at_start=True))
    proc = snakemake(workflow, "--keep-going", check=False)
    assert proc.returncode != 0
    records = failure_records(workflow)
    assert len(records) == 4  # every cell of both servers
    for record in records.values():
        assert "exited with code 1 before it was ready" in record["cause"]
        assert "ImportError while loading the model" in record["cause"]  # the server log's tail
    assert server_processes_under(workflow) == []
    no_partial_files(workflow)


def test_server_never_becomes_ready(workflow):
    config = fast_config(never_ready=True)
    config["server"] = {"startup_timeout": 2}
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    causes = [r["cause"] for r in failure_records(workflow).values()]
    assert causes and all("not ready after 2 s" in c and "SIMULATED" in c for c in causes)
    assert server_processes_under(workflow) == []


def test_crash_mid_cell_with_keep_going_lets_the_other_server_finish(workflow):
    config = fast_config()
    config["methods"][1]["env"] = {"SPECSWEEP_SIM_CRASH_AFTER": "6"}  # only dflash's server crashes
    write_config(workflow, config)
    proc = snakemake(workflow, "--keep-going", check=False)
    assert proc.returncode != 0
    cells = workflow / "results" / "cells" / "tp1"
    assert sorted(p.name for p in (cells / "ar" / "short").glob("*.json")) == ["c1.json", "c2.json"]
    assert not (cells / "dflash").exists() or not list((cells / "dflash").rglob("*.json"))
    (record,) = failure_records(workflow).values()
    assert record["cell"]["method"] == "dflash" and record["cell"]["concurrency"] == 2
    assert "server died" in record["cause"] and "crashing at request 6" in record["server_log_tail"]
    events = Journal(workflow).new_events()
    assert "results/cells/tp1/dflash/short/c1.json" in [e["cell"] for e in events if e["event"] == "measured"]
    assert server_processes_under(workflow) == []
    no_partial_files(workflow)
    # the rerun measures only what is missing and clears the failure record
    snakemake(workflow, "results/summary.csv")
    measured = [e["cell"] for e in Journal(workflow).new_events()[len(events) :] if e["event"] == "measured"]
    assert measured == ["results/cells/tp1/dflash/short/c2.json"]
    assert failure_records(workflow) == {}


@pytest.mark.parametrize(
    "fault,category",
    [
        ({"error_rate": 0.5}, "http_status"),
        ({"truncate_rate": 0.5}, "truncated"),
        ({"hang_after_tokens": 5}, "timeout"),
    ],
)
def test_request_faults_are_counted_never_dropped(workflow, fault, category):
    config = fast_config(**fault)
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["server"] = {"request_timeout": 2}
    config["failures"] = {"keep_going": True}  # cells with failures are not final: go on with them
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert (summary["requests_sent"] == 4).all()
    assert summary["requests_failed"].sum() > 0
    failed = summary[summary["requests_failed"] > 0]
    assert all(category in f for f in failed["failures"])
    assert not failed["final"].any() and summary.loc[summary["requests_failed"] == 0, "final"].all()
    for path in (workflow / "results" / "cells").rglob("*.json"):
        cell = json.loads(path.read_text())
        assert len(cell["requests"]) == 4
        assert sum(cell["metrics"]["failures"].values()) == cell["metrics"]["requests_failed"]
    # the 99th percentile with failures as +inf falls among them (1 of 4 requests is more than 1%), written "inf"
    assert (failed["e2e_p99_with_failures"] == math.inf).all() and (failed["ttft_p99_with_failures"] == math.inf).all()
    with open(workflow / "results" / "summary.csv", newline="") as table:
        written = [row["e2e_p99_with_failures"] for row in csv.DictReader(table) if row["requests_failed"] != "0"]
    assert written == ["inf"] * len(failed)
    reported = Tables.read(workflow / "results").summary  # what the report reads
    assert (reported.loc[reported["requests_failed"] > 0, "e2e_p99_with_failures"] == math.inf).all()
    assert server_processes_under(workflow) == []


def server_port(process) -> int:
    argv = process.cmdline()
    return int(argv[argv.index("--port") + 1])


def test_a_server_that_stalls_leaves_a_cell_that_is_not_final(workflow):
    """SIGSTOP the server mid-cell for longer than the request timeout: the cell keeps its timeouts, is not cached,
    the run says so and fails; the next run measures the cell again."""
    config = fast_config(requests=8, max_new_tokens=256, time_scale=1)  # real time: caught with requests in flight
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["concurrency"] = [2]
    config["server"] = {"request_timeout": 2}
    write_config(workflow, config)
    run = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", "results/summary.csv"],
        cwd=workflow,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, stalled = time.monotonic() + patience(24), None
        while stalled is None and time.monotonic() < deadline and run.poll() is None:
            for process in server_processes_under(workflow):
                try:
                    gauges = parse_prometheus(
                        requests.get(f"http://127.0.0.1:{server_port(process)}/metrics", timeout=1).text
                    )
                except (requests.RequestException, ValueError, psutil.NoSuchProcess):
                    continue
                if gauges.get("sglang:num_running_reqs", 0) > 0:
                    process.suspend()  # SIGSTOP with requests in flight
                    stalled = process
                    break
            time.sleep(0.05)
        assert stalled is not None, "the cell never had requests in flight"
        time.sleep(4)
        stalled.resume()
        out, _ = run.communicate(timeout=patience(60))
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0, out[-3000:]
    cell = "results/cells/tp1/ar/short/c2.json"
    assert f"cell {cell} is not final: " in out and "requests timed out (failures.max_timeouts: 0)" in out
    assert "not cached" in out and "the next run measures these again" in out
    record = json.loads((workflow / "results" / "failed" / "tp1" / "ar" / "short" / "c2.json").read_text())
    assert "the cell is not final" in record["cause"]
    assert record["measurement"]["metrics"]["failures"]["timeout"] > 0  # what was measured is kept beside it
    assert CellCache(workflow / "results" / "cache").get(record["key"]) is None
    assert not (workflow / cell).exists()
    assert server_processes_under(workflow) == []
    # the next run measures it again (no stall now) and caches it
    journal = Journal(workflow)
    journal.new_events()
    snakemake(workflow, "results/summary.csv")
    assert [e["cell"] for e in journal.new_events() if e["event"] == "measured"] == [cell]
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert summary["final"].all() and (summary["requests_failed"] == 0).all()
    assert not (workflow / "results" / "failed" / "tp1" / "ar" / "short" / "c2.json").exists()


def test_keep_going_aggregates_a_cell_that_is_not_final_and_the_next_run_measures_it_again(workflow):
    config = fast_config(error_rate=0.5)
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["concurrency"] = [1]
    config["workloads"][0]["requests"] = 8
    config["failures"] = {"keep_going": True}
    write_config(workflow, config)
    journal = Journal(workflow)
    out = snakemake(workflow, "results/summary.csv").stdout
    cell = "results/cells/tp1/ar/short/c1.json"
    assert f"cell {cell} is not final: " in out and "failures.max_failed_share: 0.01" in out
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert not summary["final"].any() and summary["requests_failed"].sum() > 0
    assert [e["cell"] for e in journal.new_events() if e["event"] == "measured"] == []  # not cached as final
    for _ in range(2):  # every later run measures it again while it is not final
        snakemake(workflow, "results/summary.csv")
        assert [e["cell"] for e in journal.new_events() if e["event"] == "cell_failed"] == [cell]
    # without keep_going the cell it left is refused by aggregation
    config["failures"] = {"keep_going": False}
    write_config(workflow, config)
    proc = snakemake(workflow, "results/summary.csv", "--allowed-rules", "aggregate", check=False)
    assert proc.returncode != 0 and f"{cell}: it is not final: " in proc.stdout


def test_gpu_lock_held_by_a_dead_process_is_recovered(workflow):
    config = fast_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["gpu_pool"] = {"devices": 1, "lock_dir": str(workflow / "locks")}
    write_config(workflow, config)
    code = (
        "import sys, time\nfrom specsweep.gpus import GpuPool\nimport socket\n"
        "pool = GpuPool(sys.argv[1] + '/' + socket.gethostname(), ['0'])\n"
        "with pool.acquire(1):\n    print('held', flush=True)\n    time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(workflow / "locks")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    snakemake(workflow, "results/summary.csv", timeout=60)
    starts = [e for e in Journal(workflow).new_events() if e["event"] == "server_start"]
    assert starts[0]["gpus"] == ["0"]


def test_unwritable_cache_fails_before_any_server_starts(workflow):
    config = fast_config()
    blocker = workflow / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    config["cache_dir"] = str(blocker / "cache")
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert f"cannot write to {blocker / 'cache'} (cache_dir)" in proc.stdout
    assert list((workflow / "logs" / "bench").glob("server-*.log")) == []  # no server was ever launched
    assert server_processes_under(workflow) == []


def test_two_runs_on_the_same_results_folder(workflow):
    config = fast_config(time_scale=1)  # real time: the first run still measures when the second starts
    config["workloads"][0]["requests"] = 40
    write_config(workflow, config)
    first = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", "results/summary.csv"],
        cwd=workflow,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + patience(12)
    while time.monotonic() < deadline and not any(e["event"] == "server_start" for e in Journal(workflow).new_events()):
        time.sleep(0.2)
    second = snakemake(workflow, check=False)
    # refused: the folder is locked, or (when the first run is further on) its outputs are marked as being written
    assert second.returncode != 0
    assert "LockException" in second.stdout or "seem to be incomplete" in second.stdout, second.stdout[-3000:]
    out, _ = first.communicate(timeout=patience(120))
    assert first.returncode == 0, out[-2000:]
    assert len(list((workflow / "results" / "cells").rglob("*.json"))) == 4


def test_api_key_reaches_server_and_client_but_never_argv_logs_or_results(workflow):
    secret = "sk-specsweep-test-7f3a9c"
    config = fast_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["server"] = {"api_key_env": "SPECSWEEP_TEST_KEY"}
    write_config(workflow, config)
    env = {**os.environ, "SPECSWEEP_TEST_KEY": secret}
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2"],
        cwd=workflow,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen_cmdlines = []
    while proc.poll() is None:
        for p in server_processes_under(workflow):
            try:
                cmdline = " ".join(p.cmdline())
            except psutil.NoSuchProcess:
                continue
            if cmdline:  # empty while a process is being created or reaped
                seen_cmdlines.append(cmdline)
        time.sleep(0.1)
    out = proc.stdout.read()
    assert proc.returncode == 0, out[-3000:]
    servers = [c for c in seen_cmdlines if "--help" not in c]
    assert servers and all(secret not in c and "--config" in c for c in servers)
    assert secret not in out
    for folder in ("results", "logs", ".snakemake"):
        for path in (workflow / folder).rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert (summary["requests_failed"] == 0).all()  # the client authenticated


def test_missing_api_key_variable_is_named(workflow):
    config = fast_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["server"] = {"api_key_env": "SPECSWEEP_UNSET_KEY"}
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0 and "SPECSWEEP_UNSET_KEY" in proc.stdout
    assert server_processes_under(workflow) == []
