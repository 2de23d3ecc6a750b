"""The report's pieces: names that break in any column, and appendices that show only what their titles say."""

from __future__ import annotations

import io
import json
import re

import pandas as pd

from conftest import REPO
from specsweep import report


def test_a_name_may_break_within_every_run_of_a_few_characters_and_stays_what_it_was():
    breaks = r"\\allowbreak\{\}|\\penalty200\{\}"
    for name in (
        "ar",
        "dflash-b16",
        "ngram_d8",
        "a--b",
        "qwen3instructdflashblocksixteentritonh200",
        "tp1/e.x:y",
        "dflash@sglang-0.5.16",
    ):
        tex = report.tex_name(name)
        assert re.sub(breaks, "", tex).replace("-{}", "-").replace("\\_", "_") == name, tex  # nothing else added
        assert max(len(run) for run in re.split(breaks + "|-", tex)) <= report.NAME_RUN + 1, tex
        assert "--" not in tex, tex  # two hyphens stay two hyphens (no en dash)
    assert report.tex_name("ddtree-b8") == "ddtree-b8"  # TeX breaks after a hyphen: short words stay as written
    assert report.tex_name("x_y") == r"x\_\allowbreak{}y"
    assert report.tex_name("dflash@sglang-0") == r"dflash@\allowbreak{}sglang-0"  # a method on an engine breaks at @


def test_waiting_for_a_slot_lists_open_loop_cells_only():
    """The committed H200 record ran closed loop; its client sent some requests milliseconds after their slot came
    free (host jitter at concurrency 64): no request waited for a slot."""
    record = REPO / "benchmarks" / "gpu" / "spec-2026-12-01"
    summary = pd.read_csv(record / "summary.csv")
    late = summary[summary["queue_delay_p99"] > 0.001]
    assert len(late) >= 5
    tables = report.Tables(summary, *(pd.DataFrame() for _ in range(4)))
    environment = json.loads((record / "environment.json").read_text())
    view = {"model": "Qwen3-8B", "sampling": "temperature 0", "load_model": "closed"}
    data: dict[str, str] = {}
    assert not report.setup_tables(tables, environment, view, False, data)["has_queue"]
    assert report.setup_tables(tables, environment, {**view, "load_model": "poisson"}, False, data)["has_queue"]
    shown = pd.read_csv(io.StringIO(data["queue.csv"]))
    assert len(shown) == len(late)


def test_waiting_for_a_slot_lists_a_trace_cell_under_a_closed_loop_configuration():
    """A trace cell runs open loop whatever load.model says: the check lists its queued requests (a cell with a
    trace column), and still no closed-loop cell's late client."""
    record = REPO / "benchmarks" / "gpu" / "spec-2026-12-01"
    summary = pd.read_csv(record / "summary.csv")
    late = summary.index[summary["queue_delay_p99"] > 0.001]
    traced = list(late[:2])
    summary["trace"] = [f"trace t.jsonl (mooncake), line {i}" if i in traced else None for i in summary.index]
    tables = report.Tables(summary, *(pd.DataFrame() for _ in range(4)))
    environment = json.loads((record / "environment.json").read_text())
    view = {"model": "Qwen3-8B", "sampling": "temperature 0", "load_model": "closed"}
    data: dict[str, str] = {}
    assert report.setup_tables(tables, environment, view, False, data)["has_queue"]
    shown = pd.read_csv(io.StringIO(data["queue.csv"]))
    assert len(shown) == len(traced)
    assert sorted(shown["concurrency"]) == sorted(summary.loc[traced, "concurrency"])


def test_the_engines_section_reads_a_table_where_no_row_has_a_reason(tmp_path):
    """Every row compared (two engines measured apart, none sharing a cell): the reason column reads back empty, as
    floats, and the section counts no row as one measurement (it raised AttributeError: no .str on floats)."""
    from specsweep.aggregate import ENGINE_COLUMNS
    from specsweep.report import engines_section

    row = {c: None for c in ENGINE_COLUMNS}
    row.update(method="ar", workload="short", concurrency=1, tp=1, repetition=0, engine="slow", reference="base")
    row.update({f"{m}_ratio": 0.5 for m in ("output_throughput", "tpot_p50", "ttft_p50")}, differs=True, pairs=12)
    pd.DataFrame([row], columns=ENGINE_COLUMNS).to_csv(tmp_path / "engines.csv", index=False)
    flags = engines_section(tmp_path, {})
    assert flags["has_engines"] and flags["engines_one_measurement"] == 0 and flags["engines_not_compared"] == 0
