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
    assert [p.name for p in RECORDS] == [
        "forced-2026-12-02",
        "forced-moe-2026-12-02",
        "record-2026-11-30",
        "spec-2026-12-01",
    ]


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


# ------------------------------------------------------------------ the engine comparison

# NGRAM on two SGLang releases on the H200, short prompts at concurrency 4 (48 sessions each)
ENGINE_CELLS = GPU / "engines-2026-12-02" / "cells" / "tp1"
ENGINE_ORDER = ["sglang-0.5.16", "sglang-0.5.14"]


def engine_cells(failing: int = 0) -> dict:
    """{path: cell} of the two releases' cells, the first ``failing`` requests of 0.5.14's answered with HTTP 500 as
    the client records one (kept with failures.keep_going)."""
    cells = {str(p): json.loads(p.read_text()) for p in sorted(ENGINE_CELLS.glob("ngram@*/short/c4.json"))}
    (newer,) = [c for c in cells.values() if c["method"]["engine"] == "sglang-0.5.14"]
    for record in newer["requests"][:failing]:
        record.update(
            error="http_status",
            error_detail="HTTP 500: injected",
            output_text="",
            output_tokens=0,
            chunk_times=[],
            chunk_tokens=[],
            finish_reason=None,
        )
    return cells


# DDTree on the ddtree-v2 build on the H200, without the stage profiler: budget 15 (a verify of 16, the chain's width)
# and 16 (17); with the profiler: budgets 22, 32 and 64, a configuration of their own without a chain-width budget
DDTREE_CELLS = GPU / "ddtree-engines-2026-12-03" / "cells" / "tp1"


def test_each_ddtree_budget_is_compared_with_its_configurations_budget_of_the_chains_width():
    from specsweep.aggregate import width_cliff

    cells = {str(p): json.loads(p.read_text()) for p in sorted(DDTREE_CELLS.glob("ddtree*/*/c*.json"))}
    rows = width_cliff(cells)
    # budget 16 against 15 at each workload and concurrency; budgets 22-64 have no chain-width budget of their own
    assert len(rows) == 8 and set(rows["family"]) == {"ddtree-plain@ddtree-v2"}
    assert set(rows["method"]) == {"ddtree-plain-b16@ddtree-v2"} and set(rows["reference"]) == {
        "ddtree-plain-b15@ddtree-v2"
    }
    assert (rows["verify_width"] == 17).all() and (rows["reference_verify_width"] == 16).all()
    assert list(rows["concurrency"][rows["workload"] == "short"]) == [1, 4, 16, 64]
    # short/16: budget 16 stalls (about half budget 15's throughput), beyond its interval; the ratio is the cells'
    stalled = rows[(rows["workload"] == "short") & (rows["concurrency"] == 16)].iloc[0]
    assert stalled["output_throughput_ratio_hi"] < 1 and stalled["differs"]
    by_name = {
        c["cell"]["method"]: c
        for c in cells.values()
        if (c["cell"]["workload"], c["cell"]["concurrency"]) == ("short", 16)
    }
    own = [by_name[f"ddtree-plain-b{b}@ddtree-v2"]["metrics"]["output_throughput"] for b in (16, 15)]
    assert stalled["output_throughput_ratio"] == pytest.approx(own[0] / own[1], rel=0.02)
    # a chain-width budget in the profiled configuration brings its wider budgets in, against it alone
    profiled = GPU / "ddtree-2026-12-03" / "cells" / "tp1" / "ddtree-b15@ddtree-v2"
    cells.update({str(p): json.loads(p.read_text()) for p in sorted(profiled.glob("*/c*.json"))})
    wider = width_cliff(cells)
    assert set(wider.loc[wider["family"] == "ddtree@ddtree-v2", "budget"]) == {22, 32, 64}
    assert set(wider.loc[wider["family"] == "ddtree@ddtree-v2", "reference"]) == {"ddtree-b15@ddtree-v2"}
    # the profiled pairs say both sides ran every profiled round on a captured CUDA graph; the unprofiled do not know
    profiled_pairs = wider[wider["family"] == "ddtree@ddtree-v2"]
    assert (profiled_pairs["cuda_graph_share"] == 1.0).all() and (
        profiled_pairs["reference_cuda_graph_share"] == 1.0
    ).all()
    assert rows["cuda_graph_share"].isna().all()


def ddtree_plain_cells() -> dict:
    return {str(p): json.loads(p.read_text()) for p in sorted(DDTREE_CELLS.glob("ddtree-plain*/*/c*.json"))}


def test_a_budget_is_never_paired_with_one_of_another_cap_flag_or_under_a_swept_name():
    """Budgets pair by what their methods run less the budget, not by name: a top-k sweep's names (ddtree-b15-t8)
    still pair; a cap or a flag of its own on the wider budget makes it another configuration, with no chain-width
    budget of its own, so no row."""
    from specsweep.aggregate import width_cliff

    def renamed(cells: dict, old: str, new: str) -> dict:
        out = copy.deepcopy(cells)
        for cell in out.values():
            cell["cell"]["method"] = cell["cell"]["method"].replace(old, new)
            cell["method"]["name"] = cell["method"]["name"].replace(old, new)
        return out

    swept = width_cliff(renamed(renamed(ddtree_plain_cells(), "-b15@", "-b15-t8@"), "-b16@", "-b16-t8@"))
    assert len(swept) == 8 and set(swept["family"]) == {"ddtree-plain-t8@ddtree-v2"}
    for change in ({"params": {"topk": 2}}, {"flags": ["--disable-cuda-graph"]}, {"env": {"SGLANG_X": "1"}}):
        cells = ddtree_plain_cells()
        for cell in cells.values():
            if cell["method"]["params"]["budget"] == 16:
                for key, value in change.items():
                    cell["method"][key] = (
                        {**cell["method"][key], **value} if isinstance(value, dict) else cell["method"][key] + value
                    )
        assert width_cliff(cells).empty, change


def test_a_budget_pair_with_a_cell_that_is_not_final_has_no_ratio_and_says_why():
    from specsweep.aggregate import width_cliff
    from specsweep.cells import DEFAULT_FAILURES

    cells = ddtree_plain_cells()
    (wider,) = [c for c in cells.values() if c["cell"]["method"].startswith("ddtree-plain-b16") and
                (c["cell"]["workload"], c["cell"]["concurrency"]) == ("short", 4)]  # fmt: skip
    for record in wider["requests"]:
        record.update(error="http_status", error_detail="HTTP 500: injected", output_tokens=0, chunk_times=[])
    rows = width_cliff(cells, DEFAULT_FAILURES)
    failed = rows[(rows["workload"] == "short") & (rows["concurrency"] == 4)].iloc[0]
    assert (
        pd.isna(failed["output_throughput_ratio"])
        and "ddtree-plain-b16@ddtree-v2's cell is not final" in failed["reason"]
    )
    assert rows["output_throughput_ratio"].notna().sum() == 7


def test_engines_whose_cells_are_final_are_compared():
    from specsweep.aggregate import engine_comparison
    from specsweep.cells import DEFAULT_FAILURES

    (row,) = engine_comparison(engine_cells(), ENGINE_ORDER, DEFAULT_FAILURES).to_dict("records")
    assert (row["engine"], row["reference"], row["pairs"]) == ("sglang-0.5.14", "sglang-0.5.16", 48)
    assert row["engine_final"] and row["reference_final"] and pd.isna(row["reason"])
    assert row["output_throughput_ratio_lo"] < row["output_throughput_ratio"] < row["output_throughput_ratio_hi"]
    assert row["differs"] == any(row[f"{m}_differs"] for m in ("output_throughput", "tpot_p50", "ttft_p50"))
    assert row["exact_match_rate"] == 1.0


def test_the_engine_rows_go_in_order_of_concurrency_as_numbers():
    """Cells of one method and workload at concurrency 1, 4 and 16 on both releases: the rows read 1, 4, 16 (sorted
    as text they read 1, 16, 4)."""
    from specsweep.aggregate import engine_comparison
    from specsweep.cells import DEFAULT_FAILURES

    cells = {str(p): json.loads(p.read_text()) for p in sorted(ENGINE_CELLS.glob("ngram@*/short/c*.json"))}
    rows = engine_comparison(cells, ENGINE_ORDER, DEFAULT_FAILURES)
    assert list(rows["concurrency"]) == [1, 4, 16]


@pytest.mark.parametrize("failing,words", [(48, "48 of 48 requests failed"), (1, "1 of 48 requests failed")])
def test_an_engine_whose_cell_is_not_final_is_not_compared_and_the_table_says_why(failing, words):
    """Every request failed (or one: above failures.max_failed_share) on one engine, kept with keep_going: the row
    says which side is not final and why, and shows no ratio, no differs and no share of equal replies (it showed
    "differs: no" over 0 pairs)."""
    from specsweep.aggregate import engine_comparison
    from specsweep.cells import DEFAULT_FAILURES

    (row,) = engine_comparison(engine_cells(failing), ENGINE_ORDER, DEFAULT_FAILURES).to_dict("records")
    assert row["engine_final"] is False and row["reference_final"] is True
    assert row["reason"] == (
        f"sglang-0.5.14's cell is not final: {words} (http_status {failing}; failures.max_failed_share: 0.01)"
    )
    shown = ["output_throughput_ratio", "tpot_p50_ratio", "ttft_p50_ratio", "differs", "exact_match_rate", "pairs"]
    assert all(pd.isna(row[k]) for k in shown), {k: row[k] for k in shown}


def test_final_cells_with_no_session_completed_on_both_say_so_and_not_that_nothing_differs():
    from specsweep.aggregate import engine_comparison

    lenient = {"max_timeouts": 0, "max_failed_share": 1.0, "keep_going": True}
    (row,) = engine_comparison(engine_cells(48), ENGINE_ORDER, lenient).to_dict("records")
    assert row["engine_final"] and row["reference_final"]
    assert row["reason"] == "no session completed on both engines" and row["pairs"] == 0
    assert pd.isna(row["output_throughput_ratio"]) and row["differs"] is None
