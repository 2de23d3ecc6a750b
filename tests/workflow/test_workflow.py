"""The whole workflow with real Snakemake runs on the simulated backend."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import subprocess
import time

import pandas as pd
import pytest

from conftest import PLUMBING_CLOCK, Journal, load_default_config, report_text, snakemake, write_config
from specsweep import verdict
from specsweep.cells import validate_cell
from specsweep.jobs import all_cells
from specsweep.metrics import cell_measures, combine_launches


def small_config() -> dict:
    config = load_default_config()
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "dflash", "algorithm": "dflash", "block_size": 16},
        {"name": "ddtree", "algorithm": "ddtree", "budget": [8, 16], "topk": 8},
    ]
    config["workloads"] = [
        {"name": "short", "family": "short", "requests": 4, "max_new_tokens": 64},
        {"name": "long", "family": "long", "requests": 4, "context_tokens": 2000, "max_new_tokens": 64},
    ]
    config["concurrency"] = [1, 2]
    config["warmup"] = 1
    config["sim"] = {"startup_seconds": 0.2, "time_scale": PLUMBING_CLOCK}
    return config


def cell_files(workdir):
    return sorted(str(p.relative_to(workdir)) for p in (workdir / "results" / "cells").rglob("*.json"))


@pytest.mark.long(2.7)
def test_default_config_end_to_end(workflow):
    default = load_default_config()
    default["sim"]["time_scale"] = PLUMBING_CLOCK  # the default plan's plumbing: its figures are not read here
    write_config(workflow, default)
    started = time.monotonic()
    proc = snakemake(workflow)  # two cores, as tools/run.sh gives it
    elapsed = time.monotonic() - started
    print(f"default workflow took {elapsed:.1f} s")
    # three servers started at once on the simulated 3-GPU host (sim.gpus), not two as the two cores would allow,
    # the fourth when one of them had finished, and no simulated GPU was held by two servers at a time
    out = proc.stdout
    first_done = out.index("(Rule: bench_server)")
    assert out.count("localrule bench_server:") == 4 and out[:first_done].count("localrule bench_server:") == 3
    spans = {}
    for e in Journal(workflow).new_events():
        if e["event"] == "server_start":
            spans[e["server"]] = [e["gpus"], e["time"], math.inf]
        elif e["event"] == "server_stop":
            spans[e["server"]][2] = e["time"]
    assert len(spans) == 4 and all(len(gpus) == 1 for gpus, _, _ in spans.values())
    for a, (gpus_a, start_a, stop_a) in spans.items():
        for b, (gpus_b, start_b, stop_b) in spans.items():
            assert a == b or stop_a <= start_b or stop_b <= start_a or gpus_a != gpus_b, (a, b)
    # every server job read the plan of the configuration as given (sim.runtime auto and all): its progress lines
    # say the time left, and none says the plan could not be read
    for log in (workflow / "logs" / "bench").glob("tp*.log"):
        text = log.read_text()
        assert "left for this server (plan)" in text and "from the plan (" not in text, (log.name, text[-600:])
    pdf = workflow / "results" / "report" / "report.pdf"
    assert pdf.read_bytes().startswith(b"%PDF")
    tex = (workflow / "results" / "report" / "report.tex").read_text()
    assert "SIMULATED BACKEND" in tex and "Warning: simulated results" in tex
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    config = load_default_config()
    levels = sum(len(w.get("concurrency") or config["concurrency"]) for w in config["workloads"])
    expected = len(config["tp"]) * 4 * levels
    assert len(summary) == expected == len(cell_files(workflow))
    # every cell held its label: its peak in flight reached it and a steady-state window exists
    assert (summary["concurrency_peak"] == summary["concurrency"]).all() and summary["concurrency_held"].all()
    assert summary["simulated"].all()
    assert (summary["requests_failed"] == 0).all()
    for path in cell_files(workflow):
        cell = json.loads((workflow / path).read_text())
        validate_cell(cell)
        assert cell["simulated"] is True
        # the fast clock is said by the cell, from the configuration and from the server itself
        assert cell["provenance"]["sim_profile"]["time_scale"] == PLUMBING_CLOCK
        assert cell["provenance"]["server_info"]["sim_time_scale"] == PLUMBING_CLOCK
    assert f"on a clock run {PLUMBING_CLOCK:g} times fast" in " ".join(tex.split())  # and the report's first page
    ar = summary[summary["algorithm"] == "ar"]
    assert (ar["speedup"] == 1.0).all()
    spec = summary[summary["algorithm"] != "ar"]
    assert (spec["acceptance_length"] > 1).all()
    # what summary.csv and the report's table of all cells print is each cell's records computed by today's code
    data = json.loads((workflow / "results" / "report" / "data.json").read_text())
    printed = pd.read_csv(io.StringIO(data["csv"]["cells.csv"])).set_index(["tp", "method", "workload", "concurrency"])
    rows = summary.set_index("cell_file")
    for path in cell_files(workflow):
        cell = json.loads((workflow / path).read_text())
        today, row, c = cell_measures(cell), rows.loc[path], cell["cell"]
        shown = printed.loc[(c["tp"], c["method"], c["workload"], c["concurrency"])]
        for value, expected in (
            (row["output_throughput"], today["output_throughput"]),
            (shown["output_throughput"], today["output_throughput"]),
            (row["ttft_p99"], today["ttft"]["p99"]),
            (shown["ttft_p50_ms"], today["ttft"]["p50"] * 1000),
            (row["tpot_p50"], today["tpot"]["p50"]),
            (shown["tpot_p50_ms"], today["tpot"]["p50"] * 1000),
            (row["acceptance_length"], today["acceptance_length"] or math.nan),
            (shown["requests_completed"], today["requests_completed"]),
        ):
            assert value == pytest.approx(expected, rel=1e-12, nan_ok=True), path
    the_verdict_comes_first(workflow)
    snakemake(workflow, "--report", "report.html")
    html = (workflow / "report.html").read_text(errors="replace")
    assert "conc-throughput-short-tp1.png" in html and "report.pdf" in html and "sweep-ddtree.png" in html
    the_html_report_carries_the_stamp_and_the_verdict_table(workflow, html)


def the_verdict_comes_first(workflow):
    """Page 1 after the title is the verdict: the SIMULATED stamp, then the verdict table (every row of
    verdict.verdict_table of combined.csv, its best method and speedup); methodology and definitions come last."""
    pdf = workflow / "results" / "report" / "report.pdf"
    page = subprocess.run(
        ["pdftotext", "-layout", "-f", "1", "-l", "1", str(pdf), "-"], capture_output=True, text=True, check=True
    )
    first = " ".join(page.stdout.split())
    assert first.index("1 Verdict") < first.index("SIMULATED.") < first.index("Table 1: The verdict per TP")
    assert "Warning: simulated results." in first and "SIMULATED BACKEND: not measured on GPUs" in first
    table = verdict.verdict_table(pd.read_csv(workflow / "results" / "combined.csv"))
    assert len(table) == 7  # (short: 1, 4, 16; long and agent: 1, 4), each with three speculative methods
    rows = first[first.index("Table 1") :]
    for row in table.itertuples():
        shown = f"{row.tp} {row.workload} {row.concurrency} {row.best} {row.speedup:.2f} {row.verdict}"
        assert shown in rows, shown
        rows = rows[rows.index(shown) + len(shown) :]  # in the table's order
    text = report_text(workflow)
    assert text.index("Single-stream speed") > text.index("1 Verdict")
    assert text.index("Methodology, provenance and definitions") > text.index("Failures")
    assert text.count("Findings") == 1 and "Confidence" in text and "sessions per cell" in text


def the_html_report_carries_the_stamp_and_the_verdict_table(workflow, html: str):
    """Snakemake's report (snakemake 9's HTML reporter: a page whose results are embedded as data URIs) says on its
    front page that the backend was simulated, and its first category, the verdict, holds verdict.html with the stamp
    and the verdict table."""
    description = json.loads(re.search(r"var workflow_desc = (.*?);\n", html, re.S).group(1))
    assert "SIMULATED BACKEND: not measured on GPUs" in description and "1 Verdict" in description
    results = json.loads(re.search(r"var results = (\{.*?\});\n", html, re.S).group(1))
    categories = json.loads(re.search(r"var categories = (\{.*?\});\n", html, re.S).group(1))
    assert "results/report/verdict.html" in categories["1 Verdict"]["Other"]
    entry = results["results/report/verdict.html"]
    assert entry["caption"].startswith("<p><strong>SIMULATED BACKEND: not measured on GPUs.</strong>")
    page = base64.b64decode(entry["data_uri"].split("base64,", 1)[1]).decode()
    assert "<span class='flags'>SIMULATED.</span>" in page and "Warning: simulated results." in page
    assert "data:image/png;base64," in page  # the heatmap, inlined
    table = verdict.verdict_table(pd.read_csv(workflow / "results" / "combined.csv"))
    rows = re.findall(
        r"<tr><td>(\d+)</td><td class='name'>([^<]+)</td><td>(\d+)</td><td class='name'>([^<]+)</td>", page
    )
    assert rows == [(str(r.tp), r.workload, str(r.concurrency), r.best) for r in table.itertuples()]


@pytest.mark.long(3.3)
def test_partial_reruns_measure_only_stale_cells(workflow):
    config = small_config()
    write_config(workflow, config)
    journal = Journal(workflow)
    snakemake(workflow, "results/summary.csv", cores=4)  # (a)-(b) measure: the report is built from (c) on
    first = journal.new_events()
    assert {e["server"] for e in first if e["event"] == "server_start"} == {
        "tp1/ar",
        "tp1/dflash",
        "tp1/ddtree-b8",
        "tp1/ddtree-b16",
    }
    assert len([e for e in first if e["event"] == "measured"]) == 4 * 2 * 2

    # (a) change one DDTree budget: only that method's cells are measured, no other server starts
    config["methods"][2]["budget"] = [8, 32]
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    events = journal.new_events()
    assert {e["server"] for e in events if e["event"] == "server_start"} == {"tp1/ddtree-b32"}
    measured = [e["cell"] for e in events if e["event"] == "measured"]
    assert len(measured) == 4 and all("/ddtree-b32/" in c for c in measured)

    # (b) change one workload's request count: only that workload's cells are measured
    config["workloads"][1]["requests"] = 5
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    events = journal.new_events()
    measured = [e["cell"] for e in events if e["event"] == "measured"]
    assert len(measured) == 4 * 2 and all("/long/" in c for c in measured)
    hits = [e["cell"] for e in events if e["event"] == "cache_hit"]
    assert len(hits) == 4 * 2 and all("/short/" in c for c in hits)

    # (c) change a report-only setting: only the report's rules rerun, no cell is measured
    assert "bench_server" not in snakemake(workflow).stdout  # the whole workflow: every cell is there already
    pdf = workflow / "results" / "report" / "report.pdf"
    before = pdf.stat().st_mtime_ns
    config["report"] = {"title": "A new title"}
    write_config(workflow, config)
    assert rules_to_run(workflow) == {"report_data", "report_pdf", "report_figures", "report_verdict", "all"}
    snakemake(workflow)
    assert journal.new_events() == []
    assert pdf.stat().st_mtime_ns != before
    assert "A new title" in (workflow / "results" / "report" / "report.tex").read_text()

    # (d) nothing changed: nothing to do, also when values arrive as --config strings
    assert "Nothing to be done" in snakemake(workflow, "-n").stdout
    assert (
        "Nothing to be done" in snakemake(workflow, "-n", "--config", "tp=[1]", "warmup=1", "concurrency=[1,2]").stdout
    )

    # (e) delete one cell JSON: restored from the cache, no server started; the same content reruns nothing after
    victim = workflow / "results" / "cells" / "tp1" / "dflash" / "short" / "c2.json"
    original = victim.read_text()
    victim.unlink()
    snakemake(workflow, str(victim.relative_to(workflow)))
    events = journal.new_events()
    assert [e for e in events if e["event"] in ("server_start", "measured")] == []
    assert {e["server"] for e in events if e["event"] == "cache_hit"} == {"tp1/dflash"}
    assert victim.read_text() == original
    assert "Nothing to be done" in snakemake(workflow, "-n").stdout

    # (f) every file a rule reads is declared: changing each reruns exactly the rules that depend on it
    report = {"report_data", "report_pdf", "report_figures", "report_verdict", "all"}
    dependents = {
        "results/env/sim.json": {"bench_server", "aggregate"} | report,
        "results/cells/tp1/dflash/short/c2.json": {"aggregate"} | report,
        "results/runs/tp1/ar.json": report,
        "results/plan/predictions.csv": report,
        "results/summary.csv": report,
        "results/pareto.csv": report,
        "results/report/data.json": {"report_pdf", "report_figures", "report_verdict", "all"},
    }  # (the PDF, the figures and verdict.html are read by no rule: rule all only asks for them)
    for path, rules in dependents.items():
        file = workflow / path
        original, stat = file.read_bytes(), file.stat()
        file.write_bytes(original + b"\n")  # a change in content (a touch alone is not one: Snakemake checksums)
        assert rules_to_run(workflow) == rules, path
        file.write_bytes(original)
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert "Nothing to be done" in snakemake(workflow, "-n").stdout  # every file as it was


def rules_to_run(workflow) -> set[str]:
    """The rules a dry run would run (from its job table)."""
    out = snakemake(workflow, "-n", "--quiet", "rules").stdout
    rules = set()
    for line in out.split("Job stats:")[1].splitlines()[3:] if "Job stats:" in out else []:
        fields = line.split()
        if len(fields) == 2 and fields[0] != "total" and fields[1].isdigit():
            rules.add(fields[0])
    return rules


def test_interrupted_run_resumes_where_it_stopped(workflow):
    config = small_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    write_config(workflow, config)
    journal = Journal(workflow)
    # A first run that measures only the short workload, as if interrupted after it
    partial = dict(config, workloads=config["workloads"][:1])
    write_config(workflow, partial)
    snakemake(workflow, "results/cells/tp1/ar/short/c1.json")
    assert len([e for e in journal.new_events() if e["event"] == "measured"]) == 2
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv")
    events = journal.new_events()
    assert sorted(e["cell"] for e in events if e["event"] == "cache_hit") == [
        "results/cells/tp1/ar/short/c1.json",
        "results/cells/tp1/ar/short/c2.json",
    ]
    assert sorted(e["cell"] for e in events if e["event"] == "measured") == [
        "results/cells/tp1/ar/long/c1.json",
        "results/cells/tp1/ar/long/c2.json",
    ]
    from conftest import validated

    expected = {c["path"] for c in all_cells(validated(config))}
    assert set(cell_files(workflow)) == expected


def test_repetitions_run_methods_in_a_seeded_random_order(workflow):
    from specsweep.jobs import method_order
    from conftest import validated

    config = small_config()
    config["methods"] = [{"name": n, "algorithm": "ar"} for n in ("a", "b", "c", "d")]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 2, "max_new_tokens": 16}]
    config["concurrency"] = [1]
    config["warmup"] = 0
    config["repetitions"] = 2
    config["seed"] = 5
    write_config(workflow, config)
    snakemake(workflow, "results/summary.csv", "--cores", "1")  # the tables: the report is not looked at here
    starts = [e["server"] for e in Journal(workflow).new_events() if e["event"] == "server_start"]
    full = validated(config)
    expected = [f"tp1/{m}/r{r}" for r in (0, 1) for m in method_order(full, 1, r)]
    assert starts == expected
    assert method_order(full, 1, 0) != method_order(full, 1, 1)
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    assert sorted(summary["repetition"].unique()) == [0, 1] and len(summary) == 8
    # each cell once in combined.csv: the launches' mean with a Student-t interval across the two launches
    combined = pd.read_csv(workflow / "results" / "combined.csv").set_index("method")
    assert len(combined) == 4 and (combined["launches"] == 2).all()
    for method, launches in summary.groupby("method"):
        values = list(launches["output_throughput"])
        across = combine_launches(values)
        assert combined.loc[method, "output_throughput"] == pytest.approx(sum(values) / 2)
        assert [
            combined.loc[method, "output_throughput_lo"],
            combined.loc[method, "output_throughput_hi"],
        ] == pytest.approx(across["ci"])
