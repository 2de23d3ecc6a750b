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
