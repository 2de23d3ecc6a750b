"""The sglang backend without GPUs, through real Snakemake runs: capability checks before any server, crashes and
signals leave no process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import (
    FIXTURES,
    Journal,
    fast_config,
    load_default_config,
    patience,
    server_processes_under,
    snakemake,
    write_config,
)


def test_workflow_stops_before_any_server_when_the_build_lacks_ddtree(workflow):
    config = load_default_config()
    config["backend"] = "sglang"
    config["sglang"] = {"python": str(FIXTURES / "fake_sglang_python.sh")}
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert "does not offer --speculative-algorithm DDTREE" in proc.stdout
    assert "method 'ddtree-b" in proc.stdout
    assert Journal(workflow).new_events() == []  # no bench job ran, no server started
    env = json.loads((workflow / "results" / "env" / "sglang.json").read_text())
    assert env["server"]["version"] == "0.5.23" and env["software"]["cuda"] == "13.0"


def test_crash_mid_cell_keeps_finished_cells_and_leaves_no_process(workflow):
    config = fast_config(startup=0.2, crash_after=6)
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]  # 4 requests of c1 pass, c2 crashes
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    log = (workflow / "logs" / "bench" / "tp1-ar.log").read_text()
    assert "server died" in log and "crashing at request 6" in log  # the server log's tail is quoted
    events = Journal(workflow).new_events()
    assert [e["cell"] for e in events if e["event"] == "measured"] == ["results/cells/tp1/ar/short/c1.json"]
    assert not list((workflow / "results" / "cells").rglob("*.json"))  # no partial outputs
    assert not list((workflow / "results" / "cells").rglob("*.tmp"))
    assert server_processes_under(workflow) == []
    # the rerun measures only the missing cell (a fresh server crashes only at its 6th request)
    snakemake(workflow, "results/summary.csv")
    events = Journal(workflow).new_events()
    assert [e["cell"] for e in events if e["event"] == "measured"] == [
        "results/cells/tp1/ar/short/c1.json",
        "results/cells/tp1/ar/short/c2.json",
    ]
    assert [e["cell"] for e in events if e["event"] == "cache_hit"] == ["results/cells/tp1/ar/short/c1.json"]


@pytest.mark.parametrize(
    "sig,to_group,requests",
    [
        (signal.SIGINT, True, 200),  # Ctrl-C in a terminal: the whole foreground process group
        (signal.SIGTERM, True, 200),  # kill -TERM -<pgid>, a service manager, a batch scheduler
        (signal.SIGTERM, False, 12),  # snakemake alone: it lets running jobs finish, then exits
    ],
    ids=["SIGINT-group", "SIGTERM-group", "SIGTERM-snakemake"],
)
def test_signal_to_snakemake_leaves_no_server(workflow, sig, to_group, requests):
    config = fast_config(startup=0.2)
    config["workloads"][0]["requests"] = requests
    config["workloads"][0]["max_new_tokens"] = 256
    write_config(workflow, config)
    # a terminal's Ctrl-C reaches processes whose SIGINT is not ignored; a test run started in the background
    # of a non-interactive shell inherits SIGINT ignored, so give the run the terminal's default back
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2"],
        cwd=workflow,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    journal = Journal(workflow)
    deadline = time.monotonic() + patience(24)
    started = False  # new_events() returns each event once: remember the start (it is journaled just before launch)
    while time.monotonic() < deadline:
        started = started or any(e["event"] == "server_start" for e in journal.new_events())
        if started and server_processes_under(workflow):
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("no server started")
    time.sleep(1.0)
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=patience(36))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + patience(6)
    while time.monotonic() < deadline and server_processes_under(workflow):
        time.sleep(0.2)
    assert server_processes_under(workflow) == []
    assert not list((workflow / "results").rglob("*.tmp"))
    # cells measured before the signal stay in the cache (a rerun takes them from there)
    events = Journal(workflow).new_events()
    for event in events:
        if event["event"] == "measured":
            assert (workflow / "results" / "cache" / event["key"][:2] / f"{event['key']}.json").exists()
