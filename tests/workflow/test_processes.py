"""Processes, locks and journals through real Snakemake runs: nothing left behind, nothing double-booked."""

from __future__ import annotations

from conftest import fast_config, snakemake, write_config


def journal_files(workflow, server_file: str):
    return sorted((workflow / "results" / "cache" / "journal").rglob(f"{server_file}*.jsonl"))


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
