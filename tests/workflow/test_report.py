"""The report through real Snakemake runs: reduced plans whose methods and workloads have names of about 40 characters
compile with no empty chart and nothing past the text block, and every table number comes from the aggregated CSVs.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from conftest import (
    PLUMBING_CLOCK,
    assert_stamped,
    copy_workflow,
    load_default_config,
    pdf_text,
    server_processes_under,
    snakemake,
    write_config,
)
from specsweep import verdict
from specsweep.report import tex_name


def tiny(config: dict) -> dict:
    config.setdefault("warmup", 0)
    config["sim"] = {"startup_seconds": 0.1, "time_scale": PLUMBING_CLOCK}
    for w in config["workloads"]:
        w.setdefault("requests", 4)  # two waves at concurrency 2
        w.setdefault("max_new_tokens", 48)
    return config


PLANS = {
    "no-ddtree-one-concurrency": dict(
        methods=[{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}],
        workloads=[{"name": "short", "family": "short"}],
        concurrency=[2],
    ),
    "two-tp-budgets-agentic": dict(
        tp=[1, 2],
        concurrency=[1, 2],
        methods=[
            {"name": "ar", "algorithm": "ar"},
            {"name": "dflash", "algorithm": "dflash"},
            {"name": "ddtree", "algorithm": "ddtree", "budget": [8, 16]},
        ],
        workloads=[
            {"name": "short", "family": "short"},
            {"name": "agent", "family": "agentic_1", "source": "builtin", "turns": 3},
        ],
    ),
    "no-ar": dict(
        methods=[{"name": "dflash", "algorithm": "dflash"}, {"name": "ddtree", "algorithm": "ddtree", "budget": 8}],
        workloads=[{"name": "short", "family": "short"}],
        concurrency=[1, 2],
    ),
    "every-algorithm": dict(
        concurrency=[1, 2],
        methods=[
            {"name": "ar", "algorithm": "ar"},
            {"name": "ngram", "algorithm": "ngram", "num_draft_tokens": [8, 16], "max_bfs_breadth": 4},
            {"name": "e3-chain", "algorithm": "eagle3", "drafter": "heads/eagle3", "num_steps": 3},
            {
                "name": "e3-tree",
                "algorithm": "eagle3",
                "drafter": "heads/eagle3",
                "num_steps": 4,
                "topk": 4,
                "num_draft_tokens": 12,
            },
            {"name": "eagle", "algorithm": "eagle", "drafter": "heads/eagle", "num_steps": 2},
            {"name": "small", "algorithm": "standalone", "drafter": "models/small"},
        ],
        workloads=[{"name": "short", "family": "short", "max_new_tokens": 96}],
    ),
}


EXPECTED_TEXT = {
    "no-ddtree-one-concurrency": [
        "measures no speculative algorithm at two or more sizes",
        "one tensor-parallel size",
        "one concurrency level",
        "No multi-turn workload",
    ],
    "two-tp-budgets-agentic": ["Scaling efficiency", "Session completion time", "Prefix-cache hits per turn"],
    "no-ar": ["No AR baseline in this plan", "No comparison possible", "No verdict: this plan has no AR baseline"],
    "every-algorithm": [
        "What each speculative method verifies per round",
        "EAGLE-3: acceptance length",
        "NGRAM: acceptance length",
        "(tree)}",  # a sweep's legend names the shape each method verifies
    ],
}


# names as users write them: every method and workload of the plans gets this suffix (about 40 characters in all)
SUFFIX = "-qwen3-8b-h200-node7-2026-12-01-run4"


def long(name: str) -> str:
    return name + SUFFIX


def reduced_plan(root, name: str):
    """The results folder of a reduced plan's report, run in ``root``, its methods and workloads given long names."""
    workdir = copy_workflow(root / "wf")
    config = load_default_config()
    config.update(PLANS[name])
    config["methods"] = [{**m, "name": long(m["name"])} for m in config["methods"]]
    config["workloads"] = [{**w, "name": long(w["name"])} for w in config["workloads"]]
    write_config(workdir, tiny(config))
    snakemake(workdir, "results/report/report.pdf", "results/report/figures/setup", cores=4)
    assert server_processes_under(root) == [], "a server was left running"
    return workdir / "results"


def figures_have_data(tex: str, report_dir):
    """Every chart's CSV has at least one number for each series it draws (no empty chart)."""
    plots = re.findall(r"table\[col sep=comma,(.*?)\]\{(data/[^}]+\.csv)\}", tex.replace("\n", " "))
    assert plots
    for options, csv in plots:
        frame = pd.read_csv(report_dir / csv)
        y = re.search(r"(?:^|,)y=([^,]+)", options).group(1)
        assert frame[y].notna().any(), f"{csv}: series {y} has no data"


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=pytest.mark.long(2.6)) if name == "two-tp-budgets-agentic" else name for name in PLANS],
)
def test_reduced_plans_compile_and_say_what_has_no_data(tmp_path, name):
    results = reduced_plan(tmp_path, name)
    pdf = results / "report" / "report.pdf"
    assert pdf.read_bytes().startswith(b"%PDF")
    assert_stamped(pdf_text(pdf))  # the commit of the code that rendered it
    tex = (results / "report" / "report.tex").read_text()
    for text in EXPECTED_TEXT[name]:
        assert text in tex, text
    figures_have_data(tex, results / "report")
    everything_fits_the_text_block(results / "report" / "report.log")
    definitions_are_whole_and_given_once(tex)
    assert "Waiting for a slot" not in tex  # closed loop: a client late by host jitter waited for no slot
    assert "SIMULATED BACKEND" in tex
    # the appendix sets each server's run against the plan's prediction for the cells that run measured
    prediction = pd.read_csv(results / "report" / "data" / "prediction.csv")
    cells = pd.read_csv(results / "summary.csv")
    assert len(prediction) == cells.groupby(["tp", "method"]).ngroups
    assert (prediction["cells"] == len(cells) // len(prediction)).all() and (prediction["predicted_s"] > 0).all()
    if name == "two-tp-budgets-agentic":  # budget 8 runs the pull request's chain, 16 its tree of width 2
        modes = pd.read_csv(results / "report" / "data" / "modes.csv")
        modes = modes[modes["algorithm"] == "ddtree"].set_index("sweep_size")
        assert modes.loc[8, "tree_mode"] == "chain" and modes.loc[16, "tree_mode"] == "tree"
        assert modes.loc[16, "tree_width"] == 2 and modes.loc[16, "verify_width"] == 17
        assert "What each speculative method verifies per round" in tex
        sweep = pd.read_csv(next((results / "report" / "data").glob("sweep-ddtree-throughput-*.csv")))
        assert sweep.filter(regex=r"^s\d+$").shape[1] >= 2  # the chain and the tree are two methods, each marked
        assert tex.count("\\begin{groupplot}") == 1  # one figure of small multiples: a row per workload and TP
        every_table_number_comes_from_the_aggregated_csv(results, tex)
    if name == "every-algorithm":  # every section handles every algorithm of the registry
        data = results / "report" / "data"
        names = [long(m) for m in ("e3-chain", "e3-tree", "eagle", "small")] + [
            long("ngram") + "-d8",
            long("ngram") + "-d16",
        ]
        shown = {name: tex_name(name) for name in names}  # as the report's CSVs hold them (escaped for LaTeX)
        modes = pd.read_csv(data / "modes.csv").set_index("method")
        assert set(modes.index) == set(shown.values())
        assert modes.loc[shown[long("e3-chain")], "tree_mode"] == "chain"
        assert modes.loc[shown[long("e3-tree")], "tree_mode"] == "tree"
        assert modes.loc[shown[long("e3-tree")], "verify_width"] == 12
        assert modes.loc[shown[long("ngram") + "-d16"], "verify_width"] == 16
        assert {p.name for p in data.glob("sweep-*-acceptance-*.csv")} == {
            f"sweep-ngram-acceptance-{long('short')}-tp1.csv",
            f"sweep-eagle3-acceptance-{long('short')}-tp1.csv",
        }
        acceptance = pd.read_csv(data / "acceptance.csv").set_index("method")
        assert set(acceptance.index) == set(shown.values())
        assert (acceptance["acceptance_length_sglang"] > acceptance["acceptance_length"]).all()  # ours and SGLang's
        for table in ("break_even", "lossless"):
            assert set(pd.read_csv(data / f"{table}.csv")["method"]) == set(shown.values()), table
        assert set(pd.read_csv(data / f"pareto-{long('short')}.csv").columns) >= {"x0", "y0", "fx"}
        speedups = pd.read_csv(results / "combined.csv").set_index(["method", "concurrency"])["speedup"]
        assert speedups.loc[(long("ar"), 1)] == 1.0 and speedups.drop(long("ar"), level=0).notna().all()
        every_table_number_comes_from_the_aggregated_csv(results, tex)
        kinds_and_depths_come_from_their_tables(results, tex)


def kinds_and_depths_come_from_their_tables(results, tex: str):
    """The report's per-kind table is results/kinds.csv at the lowest concurrency; every speculative method of the
    simulated plan (whose server reports its rounds by drafts accepted) has an acceptance rate at each depth to its
    draft depth, falling with depth and summing to its acceptance length less one (up to the rounds cut short)."""
    assert "By content kind" in tex and "Acceptance per draft depth" in tex
    kinds = pd.read_csv(results / "kinds.csv")
    source = kinds[kinds["concurrency"] == kinds["concurrency"].min()]
    source = source.assign(method=source["method"].map(tex_name), workload=source["workload"].map(tex_name))
    shown = pd.read_csv(results / "report" / "data" / "content_kinds.csv")
    merged = shown.merge(source, on=["tp", "workload", "kind", "method"], suffixes=("", "_agg"))
    assert len(merged) == len(shown) == len(source) and set(shown["kind"]) == {"chat", "code", "json", "math"}
    for column in ("output_throughput", "speedup", "acceptance_length", "sessions"):
        pd.testing.assert_series_equal(merged[column], merged[f"{column}_agg"], check_names=False)
    depth = pd.read_csv(results / "acceptance_depth.csv")
    combined = pd.read_csv(results / "combined.csv").set_index(["method", "concurrency"])
    whole = depth[depth["kind"] == "(all)"]
    assert set(whole["method"]) == set(combined.index.get_level_values(0)) - {long("ar")}
    for (method, concurrency), rows in whole.groupby(["method", "concurrency"]):
        assert rows["reported"].all() and list(rows["depth"]) == list(range(1, rows["draft_depth"].iloc[0] + 1))
        assert (rows["acceptance"].diff().dropna() <= 1e-12).all(), method
        tau = combined.loc[(method, concurrency), "acceptance_length"]
        slack = rows["draft_depth"].iloc[0] * rows["requests_completed"].iloc[0] / rows["rounds"].iloc[0]
        assert tau - 1 - 1e-9 <= rows["acceptance"].sum() <= tau - 1 + slack, method


def every_table_number_comes_from_the_aggregated_csv(results, tex: str):
    # tables are typeset from CSV files only: no number is typed into the document
    tables = re.findall(r"\\pgfplotstabletypeset\[.*?\]\s*\{([^}]+)\}", tex, flags=re.S)
    assert len(tables) >= 8 and all(t.startswith("data/") and t.endswith(".csv") for t in tables)
    body = re.sub(r"\\pgfplotstabletypeset\[.*?\]\s*\{[^}]+\}", "", tex, flags=re.S)
    assert not re.search(r"&\s*\d", body), "a hand-typed tabular row"
    summary = pd.read_csv(results / "summary.csv")
    summary = summary.assign(method=summary["method"].map(tex_name), workload=summary["workload"].map(tex_name))
    key = ["tp", "method", "workload", "concurrency"]
    cells = pd.read_csv(results / "report" / "data" / "cells.csv")
    merged = cells.merge(summary, on=key, suffixes=("", "_agg"))
    assert len(merged) == len(cells) == len(summary)
    pd.testing.assert_series_equal(merged["output_throughput"], merged["output_throughput_agg"], check_names=False)
    pd.testing.assert_series_equal(merged["speedup"], merged["speedup_agg"], check_names=False)
    pd.testing.assert_series_equal(merged["ttft_p50_ms"], merged["ttft_p50"] * 1000, check_names=False)
    pd.testing.assert_series_equal(merged["itl_p99_ms"], merged["itl_p99"] * 1000, check_names=False)
    for name in ("best_budget", "break_even"):
        shown = pd.read_csv(results / "report" / "data" / f"{name}.csv")
        source = pd.read_csv(results / f"{name}.csv")
        words = ("method", "workload", "algorithm", "break_even", "states")
        source = source.assign(**{c: source[c].map(tex_name) for c in words if c in source})
        pd.testing.assert_frame_equal(shown.reset_index(drop=True), source.reset_index(drop=True))
    verdict_table_comes_from_the_aggregated_csv(results)
    acceptance = pd.read_csv(results / "report" / "data" / "acceptance.csv").merge(
        summary[summary["concurrency"] == 1], on=["tp", "method", "workload"], suffixes=("", "_agg")
    )
    assert (acceptance["acceptance_length"] == acceptance["acceptance_length_agg"]).all()
    assert len(acceptance) > 0


def verdict_table_comes_from_the_aggregated_csv(results):
    """The verdict table printed is verdict.verdict_table of combined.csv: one row per (TP, workload, concurrency)
    with a speculative cell, its best method, speedup and interval (two decimals), verdict, and the best method's
    numbers."""
    combined = pd.read_csv(results / "combined.csv")
    expected = verdict.verdict_table(combined)
    shown = pd.read_csv(results / "report" / "data" / "verdict.csv")
    assert len(shown) == len(expected) > 0
    assert list(shown["verdict"]) == list(expected["verdict"])
    assert list(shown["best"]) == [
        tex_name(m) + ("\\dag" if a else "") for m, a in zip(expected["best"], expected["artefact"])
    ]
    for text, (s, lo, hi) in zip(
        shown["speedup"], expected[["speedup", "speedup_lo", "speedup_hi"]].itertuples(index=False)
    ):
        assert text.startswith(f"\\twolines{{{s:.2f}}}") and (f"[{lo:.2f}; {hi:.2f}]" in text or pd.isna(lo)), text
    pd.testing.assert_series_equal(
        shown["throughput_per_gpu"], expected["output_throughput_per_gpu"], check_names=False
    )
    pd.testing.assert_series_equal(shown["ttft_p99_ms"], expected["ttft_p99"] * 1000, check_names=False)


def everything_fits_the_text_block(log):
    """No line, table row or chart is wider (or a page taller) than the text block: LaTeX reports each one that is."""
    over = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("Overfull")]
    assert not over, "\n".join(over)


def definitions_are_whole_and_given_once(tex: str):
    """Every metric and statistic the report defines, once each, in whole sentences."""
    items = re.findall(r"\\item\[\\texttt\{(.+?)\}\] (.*)", tex)
    names = [name for name, _ in items]
    assert "steady\\_\\allowbreak{}window" in names and len(names) == len(set(names)), names
    for name, text in items:
        assert text.endswith(".") and text.count("(") == text.count(")"), (name, text)
