"""What a dry run says after a configuration edit, through real Snakemake runs: one line per job naming what
changed (not kilobytes of JSON), the same jobs rerun as before, and warnings said once when the workflow starts."""

from __future__ import annotations

import json

from conftest import fast_config, snakemake, write_config

SUMMARY = "results/summary.csv"


def planned(output: str) -> set[str]:
    """The rules a dry run's job table lists."""
    table = output.split("Job stats:")[1].split("\n\n")[0] if "Job stats:" in output else ""
    return {line.split()[0] for line in table.splitlines()[3:] if len(line.split()) == 2 and line.split()[0] != "total"}


def test_a_dry_run_after_an_edit_says_what_changed_in_one_line_per_job(workflow):
    config = fast_config()
    write_config(workflow, config)
    snakemake(workflow, SUMMARY)

    config["sampling"]["temperature"] = 0.5
    write_config(workflow, config)
    dry = snakemake(workflow, "-n", SUMMARY).stdout
    said = sorted(line for line in dry.splitlines() if line.endswith(" changed"))  # in the order jobs are met
    assert said == [
        "aggregate: sampling.temperature (in every server job) changed",
        "tp1/ar: sampling.temperature changed",
        "tp1/dflash: sampling.temperature changed",
    ], dry[-3000:]
    # Snakemake's own reason names the job and the digest of its settings, no longer the settings themselves
    reasons = [line for line in dry.splitlines() if "Params have changed" in line]
    assert len(reasons) == 2 and all(len(line) < 300 and "tp1/" in line for line in reasons), reasons
    assert max(len(line) for line in dry.splitlines()) < 1000, "a kilobyte line"
    assert planned(dry) == {"bench_server", "aggregate"}

    # the rerun semantics are the settings' own: the jobs get the whole of them, a report-only edit reruns no job
    # of this target, and Snakemake's mtime-only trigger still ignores params (and says nothing)
    assert "changed" not in snakemake(workflow, "-n", SUMMARY, "--rerun-triggers", "mtime").stdout
    snakemake(workflow, SUMMARY)
    cell = json.loads((workflow / "results" / "cells" / "tp1" / "dflash" / "short" / "c1.json").read_text())
    assert cell["sampling"]["temperature"] == 0.5
    config["report"] = {"title": "Another title"}
    write_config(workflow, config)
    dry = snakemake(workflow, "-n", SUMMARY).stdout
    assert "Nothing to be done" in dry and " changed" not in dry

    # a workload's key is named as it is written, for every job that depends on it
    config["workloads"][0]["max_new_tokens"] = 40
    write_config(workflow, config)
    said = [line for line in snakemake(workflow, "-n", SUMMARY).stdout.splitlines() if line.endswith(" changed")]
    assert "tp1/ar: workloads[short].max_new_tokens changed" in said, said


def test_a_configuration_without_ar_is_warned_once_when_the_workflow_starts(workflow):
    config = fast_config()
    config["methods"] = [{"name": "dflash", "algorithm": "dflash"}]
    write_config(workflow, config)
    out = snakemake(workflow, "-n").stdout
    warning = "Warning: no method runs AR (algorithm: ar), the baseline every speedup is measured against"
    assert out.count(warning) == 1, out[-3000:]
    assert "report's speedup charts will be empty" in out
    config["methods"].append({"name": "ar", "algorithm": "ar"})
    write_config(workflow, config)
    assert "Warning:" not in snakemake(workflow, "-n").stdout
