"""No foreign, tampered or stale cell reaches a table: real Snakemake runs on the simulated backend.

Tables are computed from the cells' records by the code of the day; a cache entry or a cell file is used only when it
follows the cell schema, matches its digest and is the cell, with the prompts and the key, that the configuration
gives it. Anything else is refused by name (and measured again where the run can).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from conftest import (
    REPO,
    Journal,
    copy_workflow,
    fast_config,
    patience,
    server_processes_under,
    snakemake,
    write_config,
)

CELLS = "results/cells/tp1/{method}/short/c{c}.json"


@pytest.fixture(scope="module")
def quick_plan(tmp_path_factory):
    """The quick plan measured once through results/summary.csv (its folder, cache, journals and Snakemake's
    records): each test that starts from it measures in a copy of its own (measured_copy)."""
    root = tmp_path_factory.mktemp("quick-plan")
    workdir = copy_workflow(root / "wf")
    write_config(workdir, fast_config())
    snakemake(workdir, "results/summary.csv")
    assert server_processes_under(root) == []
    return workdir


def measured_copy(quick_plan, workflow):
    """``workflow`` made a copy of the measured quick plan (file times kept, so Snakemake sees it as it was left)."""
    shutil.rmtree(workflow)
    shutil.copytree(quick_plan, workflow, symlinks=True)


def cell_json(workflow, method, c):
    return json.loads((workflow / CELLS.format(method=method, c=c)).read_text())


def entry_path(workflow, key):
    return workflow / "results" / "cache" / key[:2] / f"{key}.json"


def test_a_changed_formula_recomputes_the_tables_and_measures_nothing(quick_plan, workflow, tmp_path):
    journal = Journal(workflow)
    measured_copy(quick_plan, workflow)
    before = pd.read_csv(workflow / "results" / "summary.csv").set_index(["method", "concurrency"])
    assert len(journal.new_events()) > 0
    # the same package with a new definition of output throughput (tokens per two seconds)
    package = tmp_path / "package"
    shutil.copytree(REPO / "specsweep", package / "specsweep", ignore=shutil.ignore_patterns("__pycache__"))
    metrics = package / "specsweep" / "metrics.py"
    formula = "    return sum(_tokens_in(r, *window) for r in records) / (window[1] - window[0])\n"
    assert metrics.read_text().count(formula) == 1
    metrics.write_text(metrics.read_text().replace(formula, formula.rstrip() + " / 2\n"))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "results/summary.csv"],
        cwd=workflow,
        env={**os.environ, "PYTHONPATH": str(package)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=patience(120),
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "rule bench_server" not in proc.stdout and "localrule aggregate" in proc.stdout
    assert journal.new_events() == []  # no server started, no cell measured, none even read from the cache
    after = pd.read_csv(workflow / "results" / "summary.csv").set_index(["method", "concurrency"])
    assert list(after.index) == list(before.index)
    pd.testing.assert_series_equal(after["output_throughput"], before["output_throughput"] / 2, rtol=1e-12)
    pd.testing.assert_series_equal(after["speedup"], before["speedup"], rtol=1e-12)  # a ratio of two throughputs
    pd.testing.assert_series_equal(after["ttft_p50"], before["ttft_p50"], rtol=1e-12)


def test_cells_of_another_configuration_are_refused_by_name(quick_plan, workflow):
    measured_copy(quick_plan, workflow)
    (workflow / CELLS.format(method="ar", c=1)).unlink()
    # only AR's job reruns: with mtime as the only rerun trigger the changed seed does not rerun DFlash's
    rerun = ["--rerun-triggers", "mtime", "--config", "seed=1"]
    proc = snakemake(workflow, CELLS.format(method="ar", c=1), "results/summary.csv", *rerun, check=False)
    assert proc.returncode != 0
    for c in (1, 2):
        assert (
            f"{CELLS.format(method='dflash', c=c)}: its prompts (digest " in proc.stdout
            and "it was measured for another configuration" in proc.stdout
        )
        assert f"{CELLS.format(method='ar', c=c)}:" not in proc.stdout
    assert "Delete each refused cell file and run again" in proc.stdout
    assert not (workflow / "results" / "summary.csv").exists()
    # what the message says to do: DFlash is measured for this configuration, and pairs AR's prompts again
    for c in (1, 2):
        (workflow / CELLS.format(method="dflash", c=c)).unlink()
    snakemake(workflow, "results/summary.csv", *rerun)
    summary = pd.read_csv(workflow / "results" / "summary.csv").set_index(["method", "concurrency"])
    assert (summary.loc["dflash", "lossless_exact_rate"] == 1.0).all()
    assert (summary.loc["dflash", "speedup_pairs"] == 4).all()
    for c in (1, 2):
        assert cell_json(workflow, "ar", c)["seed"] == cell_json(workflow, "dflash", c)["seed"] == 1


def test_tampered_cache_entries_are_refused_by_name_and_measured_again(workflow):
    config = fast_config(requests=6)
    config["concurrency"] = [1, 2, 3]
    write_config(workflow, config)
    journal = Journal(workflow)
    snakemake(workflow, "results/summary.csv")
    journal.new_events()
    keys = {(m, c): cell_json(workflow, m, c)["key"] for m in ("ar", "dflash") for c in (1, 2, 3)}
    entry = {cell: entry_path(workflow, key) for cell, key in keys.items()}
    edited = json.loads(entry["ar", 1].read_text())
    edited["metrics"]["output_throughput"] = 999999
    edited["requests"][0]["output_tokens"] = 999999
    entry["ar", 1].write_text(json.dumps(edited))
    entry["ar", 2].write_text(entry["dflash", 2].read_text())  # DFlash's entry under AR's key
    unmarked = json.loads(entry["dflash", 1].read_text())
    unmarked["simulated"] = False
    entry["dflash", 1].write_text(json.dumps(unmarked))
    text = entry["dflash", 2].read_text()
    entry["dflash", 2].write_text(text[: len(text) // 2])  # truncated
    entry["ar", 3].write_text("{}")
    reasons = {
        ("ar", 1): "its content does not match its digest",
        ("ar", 2): "it holds the cell tp1/dflash/short/c2, not tp1/ar/short/c2",
        ("dflash", 1): "its content does not match its digest",
        ("dflash", 2): "it cannot be read as JSON",
        ("ar", 3): "it is empty",
    }
    shutil.rmtree(workflow / "results" / "cells")
    (workflow / "results" / "summary.csv").unlink()
    out = snakemake(workflow, "results/summary.csv", "results/report/data.json").stdout
    for (method, c), reason in reasons.items():
        name = f"cache entry {entry[method, c].relative_to(workflow)} for {CELLS.format(method=method, c=c)} not used"
        assert f"{name}: {reason}" in out, name
    new = journal.new_events()
    measured = sorted(e["cell"] for e in new if e["event"] == "measured")
    assert measured == sorted(CELLS.format(method=m, c=c) for m, c in reasons)
    assert [e["cell"] for e in new if e["event"] == "cache_hit"] == [CELLS.format(method="dflash", c=3)]
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert sorted(zip(summary["method"], summary["concurrency"])) == sorted(keys)  # each cell once, none missing
    assert summary["simulated"].all() and summary["output_tokens"].max() < 999999
    assert summary["output_throughput"].max() < 999999
    assert json.loads((workflow / "results" / "report" / "data.json").read_text())["context"]["simulated"] is True
    for (method, c), key in keys.items():  # every entry is whole again, and verified
        cell = json.loads(entry_path(workflow, key).read_text())
        assert cell["simulated"] is True and cell["cell"]["method"] == method and cell["cell"]["concurrency"] == c
        assert cell == cell_json(workflow, method, c)
    assert server_processes_under(workflow) == []


def test_an_edited_cell_file_is_refused_by_aggregation_and_restored_from_the_cache(quick_plan, workflow):
    measured_copy(quick_plan, workflow)
    journal = Journal(workflow)
    journal.new_events()
    victim = workflow / CELLS.format(method="dflash", c=1)
    original = victim.read_text()
    cell = json.loads(original)
    cell["simulated"] = False
    victim.write_text(json.dumps(cell))
    proc = snakemake(workflow, "results/summary.csv", check=False)
    assert proc.returncode != 0
    assert (
        f"{CELLS.format(method='dflash', c=1)}: its content does not match its digest (it was changed after "
        "it was written)"
    ) in proc.stdout
    assert not (workflow / "results" / "summary.csv").exists()
    victim.unlink()
    snakemake(workflow, "results/summary.csv")
    new = journal.new_events()
    assert sorted(e["cell"] for e in new if e["event"] == "cache_hit") == [
        CELLS.format(method="dflash", c=c) for c in (1, 2)
    ]
    assert [e for e in new if e["event"] in ("server_start", "measured")] == []
    assert json.loads(victim.read_text()) == json.loads(original)
    assert pd.read_csv(workflow / "results" / "summary.csv")["simulated"].all()


def test_remeasure_measures_the_named_cells_every_time_it_is_given(quick_plan, workflow):
    measured_copy(quick_plan, workflow)
    journal = Journal(workflow)
    journal.new_events()
    started = [cell_json(workflow, "ar", 1)["provenance"]["started_at"]]
    for _ in range(2):  # the same request twice in a row: measured both times (it was "Nothing to be done")
        proc = snakemake(workflow, "results/summary.csv", "--config", "remeasure=tp1/ar/*/c1")
        new = journal.new_events()
        assert [e["cell"] for e in new if e["event"] == "measured"] == [CELLS.format(method="ar", c=1)]
        assert [e["server"] for e in new if e["event"] == "server_start"] == ["tp1/ar"]
        assert "remeasure: measured 1 cell (tp1/ar/short/c1)" in proc.stdout.splitlines()[-3:]
        after = cell_json(workflow, "ar", 1)
        assert after["provenance"]["started_at"] not in started
        started.append(after["provenance"]["started_at"])
        entry = entry_path(workflow, after["key"])
        assert json.loads(entry.read_text()) == after  # its cache entry replaced
        assert (workflow / "results" / "summary.csv").stat().st_mtime > entry.stat().st_mtime  # the tables made again
    # without remeasure (or with it empty, as `--config remeasure=` gives it): nothing is measured
    for extra in ([], ["--config", "remeasure="]):
        proc = snakemake(workflow, "results/summary.csv", *extra)
        assert "Nothing to be done" in proc.stdout and "remeasure:" not in proc.stdout
        assert [e for e in journal.new_events() if e["event"] in ("server_start", "measured")] == []
    assert cell_json(workflow, "ar", 1)["provenance"]["started_at"] == started[-1]


def test_remeasure_that_names_no_cell_is_refused_before_any_job(workflow):
    write_config(workflow, fast_config())
    proc = snakemake(workflow, "-n", "--config", "remeasure=tp8/*", check=False)
    assert proc.returncode != 0
    assert "remeasure: 'tp8/*' names no cell of this configuration" in proc.stdout
