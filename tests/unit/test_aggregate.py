"""Aggregation: every number of a table computed from the cells' raw records by today's code."""

from __future__ import annotations

import copy
import importlib.util
import json

import pandas as pd
import pytest

from conftest import REPO
from specsweep.aggregate import summarise_cells
from specsweep.metrics import cell_metrics

GPU = REPO / "benchmarks" / "gpu"
RECORDS = sorted(p for p in GPU.iterdir() if (p / "cells").is_dir() and (p / "summary.csv").exists())


def resummarise():
    spec = importlib.util.spec_from_file_location("resummarise", GPU / "resummarise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_gpu_records_to_check():
    assert [p.name for p in RECORDS] == ["record-2026-11-30", "spec-2026-12-01"]


@pytest.mark.parametrize("record", RECORDS, ids=[p.name for p in RECORDS])
def test_a_committed_gpu_summary_is_its_cells_computed_by_todays_code(record):
    committed = pd.read_csv(record / "summary.csv")
    recomputed = resummarise().record_summary(record)
    assert list(recomputed.columns) == list(committed.columns)
    pd.testing.assert_frame_equal(recomputed, committed, check_exact=False, rtol=1e-9)


def test_tables_never_read_the_metrics_a_cell_stores():
    # measured on the H200 before throughput moved to the steady-state window: the stored copy says 966.2 tok/s
    path = GPU / "record-2026-11-30" / "cells" / "tp1" / "ar" / "long" / "c16.json"
    cell = json.loads(path.read_text())
    assert cell["metrics"]["output_throughput"] == pytest.approx(966.197, abs=1e-3)
    today = cell_metrics(cell["requests"], 1, 16, "closed", cell["seed"], cell["server_counters"])
    assert today["output_throughput"] == pytest.approx(1091.694, abs=1e-3)
    edited = copy.deepcopy(cell)
    edited["metrics"] = {k: (999999 if isinstance(v, (int, float)) else v) for k, v in cell["metrics"].items()}
    for stored in (cell, edited):
        row = summarise_cells({"results/cells/tp1/ar/long/c16.json": stored}).iloc[0]
        assert row["output_throughput"] == pytest.approx(today["output_throughput"], rel=1e-12)
        assert row["requests_completed"] == today["requests_completed"] == 48
        assert row["ttft_p50"] == pytest.approx(today["ttft"]["p50"], rel=1e-12)
        assert row["acceptance_length_server"] == today["acceptance_length_server"]


def test_the_summary_has_every_column_of_a_cell_row_in_its_order(monkeypatch):
    # the columns are cell_row's keys, not a second list beside it that a new column has to be added to as well
    from specsweep import aggregate

    cell_row = aggregate.cell_row
    monkeypatch.setattr(aggregate, "cell_row", lambda *args: {**cell_row(*args), "new_column": 1.5})
    path = GPU / "record-2026-11-30" / "cells" / "tp1" / "ar" / "long" / "c16.json"
    cell = json.loads(path.read_text())
    summary = aggregate.summarise_cells({"results/cells/tp1/ar/long/c16.json": cell})
    assert list(summary.columns) == list(cell_row(cell, "c16.json", aggregate.cell_measures(cell))) + ["new_column"]
    assert summary.iloc[0]["new_column"] == 1.5
