"""A cell is used only when verified; a cell with too many failures is not final; gauges carry their sample count."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace

import pandas as pd
import pytest

from conftest import fast_config, validated
from specsweep.aggregate import summarise_cells
from specsweep.bench import bench_server, remeasure_summary, remeasured_outputs
from specsweep.cache import Journal
from specsweep.cells import DEFAULT_FAILURES, as_named, cell_problem, keyed_cells, unfinished
from specsweep.environment import probe
from specsweep.jobs import server_job
from specsweep.metrics import server_load


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """AR's two cells of the quick plan, measured by a bench job on the simulated backend: (expected cells, cells)."""
    root = tmp_path_factory.mktemp("bench")
    # real time: test_averaged_gauges_carry_their_sample_count reads the gauges sampled every 0.5 s
    job = replace(server_job(validated(fast_config(time_scale=1)), 1, "ar"), cache_dir=str(root / "cache"))
    environment = probe("sim")
    expected, _ = keyed_cells(job, environment["identity_digest"])
    here = os.getcwd()
    os.chdir(root)
    try:
        bench_server(job, [c["path"] for c in expected], environment, root / "logs")
        cells = [json.loads((root / c["path"]).read_text()) for c in expected]
    finally:
        os.chdir(here)
    return expected, cells


def _edit_record(cell):
    cell["requests"][0]["output_tokens"] += 1


def _unmark(cell):
    cell["simulated"] = False


def _drop_digest(cell):
    del cell["digest"]


def _drop_requests(cell):
    del cell["requests"]


TAMPERED = {
    "an edited record": (_edit_record, "its content does not match its digest (it was changed after it was written)"),
    "simulated false": (_unmark, "its content does not match its digest"),
    "no digest": (_drop_digest, "it carries no digest (written before cells were verified)"),
    "not a cell": (
        _drop_requests,
        "it does not follow the cell schema (at the top level: 'requests' is a required property)",
    ),
}


def test_a_measured_cell_is_the_cell_its_configuration_gives(measured):
    expected, cells = measured
    for want, cell in zip(expected, cells):
        assert cell_problem(cell, want) is None
        assert cell["key"] == want["key"] and cell["workload"]["digest"] == want["digest"]


@pytest.mark.parametrize("name", TAMPERED)
def test_a_tampered_cell_is_refused_saying_why(measured, name):
    expected, cells = measured
    cell = copy.deepcopy(cells[0])
    edit, reason = TAMPERED[name]
    edit(cell)
    assert cell_problem(cell, expected[0]).startswith(reason)


def test_a_cell_of_another_cell_or_configuration_is_refused_saying_why(measured):
    expected, cells = measured
    assert cell_problem({}, expected[0]) == "it is empty"
    assert cell_problem([cells[0]], expected[0]) == "it is not a JSON object"
    assert cell_problem(cells[1], expected[0]) == "it holds the cell tp1/ar/short/c2, not tp1/ar/short/c1"
    other_prompts = dict(expected[0], digest="0" * 64)
    assert cell_problem(cells[0], other_prompts) == (
        f"its prompts (digest {cells[0]['workload']['digest'][:12]}) are not the prompts this configuration sends "
        "(digest 000000000000): it was measured for another configuration"
    )
    other_key = dict(expected[0], key="f" * 64)
    assert cell_problem(cells[0], other_key) == (
        f"its key {cells[0]['key'][:12]} is not the key this configuration gives it (ffffffffffff): it was measured "
        "for another configuration"
    )


def test_a_cell_of_an_engine_named_otherwise_is_verified_then_presented_under_its_own_name(measured):
    """A cache entry measured under another engine's name (or none) stands for the cell once it is verified as
    strictly as any: its digest, the cell apart from the engine's name, its prompts and key; then it is written
    under the cell's own name with its digest computed again, and verifies as that cell."""
    expected, cells = measured
    renamed = dict(expected[0], method="ar@h200")
    assert cell_problem(cells[0], renamed) == "it holds the cell tp1/ar/short/c1, not tp1/ar@h200/short/c1"
    assert cell_problem(cells[0], renamed, any_engine_name=True) is None
    named = as_named(cells[0], renamed)
    assert named["cell"]["method"] == named["method"]["name"] == "ar@h200" and named["method"]["engine"] == "h200"
    assert cell_problem(named, renamed) is None and named["requests"] == cells[0]["requests"]
    assert as_named(named, expected[0])["method"] == cells[0]["method"]  # back to no engine: no engine key
    assert as_named(cells[0], expected[0]) is cells[0]
    tampered = copy.deepcopy(cells[0])
    _edit_record(tampered)
    assert cell_problem(tampered, renamed, any_engine_name=True).startswith("its content does not match its digest")
    other_method = dict(expected[0], method="dflash@h200")
    assert cell_problem(cells[0], other_method, any_engine_name=True).startswith("it holds the cell tp1/ar/short/c1")


def test_a_prompt_file_is_keyed_by_its_prompts_not_where_it_lies(tmp_path):
    """The same prompts in a file moved elsewhere give every cell the key it had; one prompt edited, another."""
    lines = "".join(json.dumps({"prompt": f"Question {i}: what is {i} squared?"}) + "\n" for i in range(8))
    environment = probe("sim")

    def keys(path):
        config = fast_config()
        config["workloads"] = [{"name": "mine", "family": "short", "path": str(path), "requests": 4}]
        job = server_job(validated(config), 1, "ar")
        return [c["key"] for c in keyed_cells(job, environment["identity_digest"])[0]]

    for folder in ("a", "b/c"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "prompts.jsonl").write_text(lines)
    (tmp_path / "edited.jsonl").write_text(lines.replace("Question 0", "Question zero"))
    assert keys(tmp_path / "a" / "prompts.jsonl") == keys(tmp_path / "b/c" / "prompts.jsonl")
    assert not set(keys(tmp_path / "edited.jsonl")) & set(keys(tmp_path / "a" / "prompts.jsonl"))


def records(*errors):
    return [{"error": e} for e in errors]


def test_a_cell_with_any_timeout_or_more_than_one_percent_failed_is_not_final():
    ok = [None] * 99
    assert unfinished(records(*ok, "http_status"), DEFAULT_FAILURES) is None  # 1 in 100: not more than 1%
    assert unfinished(records(*ok, "http_status", "truncated"), DEFAULT_FAILURES) == (
        "2 of 101 requests failed (http_status 1, truncated 1; failures.max_failed_share: 0.01)"
    )
    assert unfinished(records(*ok, "timeout"), DEFAULT_FAILURES) == (
        "1 of 100 requests timed out (failures.max_timeouts: 0)"
    )
    assert unfinished(records("timeout", "timeout"), DEFAULT_FAILURES).startswith("2 of 2 requests timed out")
    assert unfinished([], DEFAULT_FAILURES) == "it holds no request"
    lenient = {"max_timeouts": 2, "max_failed_share": 0.5}
    assert unfinished(records(None, None, "timeout", "timeout"), lenient) is None
    assert unfinished(records(None, "timeout", "timeout", "timeout"), lenient).startswith("3 of 4 requests timed out")


def test_remeasure_names_cells_by_glob_of_name_or_path():
    paths = [
        "results/cells/tp1/ar/short/c1.json",
        "results/cells/tp1/ar/short/c16.json",
        "results/cells/tp1/dflash/long/c1-r1.json",
        "results/cells/tp2/ar/long/c16.json",
    ]
    assert remeasured_outputs("tp1/ar/short/c1", paths) == paths[:1]
    assert remeasured_outputs("tp1/ar/*", paths) == paths[:2]
    assert remeasured_outputs("*/c16", paths) == [paths[1], paths[3]]
    assert remeasured_outputs("tp1/dflash/long/c1-r1, results/cells/tp2/*", paths) == paths[2:]
    assert remeasured_outputs("", paths) == [] and remeasured_outputs("tp8/*", paths) == []
    assert remeasured_outputs(None, paths) == [] and remeasured_outputs(" , ", paths) == []  # `--config remeasure=`


def test_remeasure_says_how_many_of_its_cells_the_run_measured(tmp_path):
    asked = ["results/cells/tp1/ar/short/c1.json", "results/cells/tp1/ar/short/c2.json"]
    ar, dflash = Journal(tmp_path / "ar.jsonl", "run"), Journal(tmp_path / "dflash.jsonl", "run")
    ar.write("server_start", server="tp1/ar")
    ar.write("measured", server="tp1/ar", cell=asked[0], key="k1")
    dflash.write("measured", server="tp1/dflash", cell="results/cells/tp1/dflash/short/c1.json", key="k3")
    journals = [ar.path, dflash.path, tmp_path / "a server this run did not start.jsonl"]
    assert remeasure_summary(asked[:1], journals) == "remeasure: measured 1 cell (tp1/ar/short/c1)"
    assert remeasure_summary(asked, journals) == (
        "remeasure: measured 1 of 2 cells (tp1/ar/short/c1); not measured: tp1/ar/short/c2 (failed, not final or not "
        "reached: see results/failed/ and logs/bench/)"
    )
    ar.write("measured", server="tp1/ar", cell=asked[1], key="k2")
    assert remeasure_summary(asked, journals) == "remeasure: measured 2 cells (tp1/ar/short/c1, tp1/ar/short/c2)"
    many = [f"results/cells/tp1/ar/short/c{c}.json" for c in range(1, 12)]
    assert remeasure_summary(many, journals, shown=2).startswith(
        "remeasure: measured 2 of 11 cells (tp1/ar/short/c1, tp1/ar/short/c2); not measured: tp1/ar/short/c3, "
        "tp1/ar/short/c4, ... (7 more)"
    )


def test_averaged_gauges_carry_their_sample_count(measured):
    _, cells = measured
    for cell in cells:
        gauges = cell["server_load"]["gauges"]
        row = summarise_cells({"c.json": cell}).iloc[0]
        assert row["server_running_samples"] == len(gauges) == cell["server_load"]["samples"]
        if gauges:
            assert row["server_running_mean"] == pytest.approx(sum(g[0] for g in gauges) / len(gauges))
    assert server_load({"gauges": []})["running"] == {"samples": 0, "mean": None, "peak": None}
    assert server_load({"gauges": [[0, 0], [2, 1], [1, 0]]})["running"] == {"samples": 3, "mean": 1.0, "peak": 2}
    # cells written before the samples were kept: the sampler's own summary, with its count
    older = {
        "samples": 2,
        "interval_s": 0.5,
        "running_mean": 1.5,
        "running_peak": 2,
        "queued_mean": 0.0,
        "queued_peak": 0,
    }
    assert server_load(older)["running"] == {"samples": 2, "mean": 1.5, "peak": 2}


def test_launches_combined_keep_every_gauge_sample_and_are_final_only_when_each_is():
    from specsweep.aggregate import combine_repetitions

    launch = dict(
        tp=1,
        method="ar",
        workload="short",
        concurrency=4,
        launches=1,
        output_throughput=100.0,
        speedup=1.0,
        ttft_p50=0.1,
        ttft_p99=0.2,
        tpot_p50=0.01,
        cell_file="a.json",
    )
    launches = pd.DataFrame(
        [
            dict(launch, repetition=0, server_running_mean=1.0, server_running_samples=2, final=True),
            dict(
                launch, repetition=1, server_running_mean=2.0, server_running_samples=3, final=False, cell_file="b.json"
            ),
        ]
    )
    (row,) = combine_repetitions(launches).to_dict("records")
    assert row["server_running_samples"] == 5 and row["server_running_mean"] == pytest.approx(8 / 5)
    assert row["final"] is False and row["launches"] == 2
