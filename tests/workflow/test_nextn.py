"""NEXTN, SGLang's multi-token-prediction heads (EAGLE run with the head the target ships), which is one entry of the
registry and its drafter's acceptance profile: it launches as SGLang 0.5.16 parses it with no drafter to name, the
simulated server decodes what its flags say, forced acceptance applies to it as to the rest of EAGLE's family, and a
workflow of it runs end to end on the simulated backend."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import FIXTURES, PLUMBING_CLOCK, load_default_config, snakemake, validated, write_config
from specsweep import algorithms, verdict
from specsweep import config as cfg
from specsweep.cells import validate_cell
from specsweep.environment import capabilities_from_help
from specsweep.jobs import server_job
from specsweep.launcher import launch_command, server_arguments
from specsweep.methods import expand_methods
from specsweep.modelling.cost import CostModel
from specsweep.modelling.decoding import Decoding
from specsweep.sglang_options import check_argv
from specsweep.sim.args import decoding_from_args, parse_args

FORCED = 2.5


def nextn_config() -> dict:
    """AR, NEXTN chains of 1 and 3 steps, and one of 3 steps with its acceptance forced, on one short workload."""
    config = load_default_config()
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "mtp", "algorithm": "nextn", "num_steps": [1, 3]},
        {"name": "mtp-forced", "algorithm": "nextn", "num_steps": 3, "accept_length": FORCED},
    ]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 8, "max_new_tokens": 96}]
    config["concurrency"] = [1, 2]
    config["warmup"] = 0
    config["sim"] = {"startup_seconds": 0.1, "time_scale": PLUMBING_CLOCK}
    return config


def test_nextn_launches_as_sglang_0_5_16_parses_it_with_the_targets_own_head():
    assert "NEXTN" in capabilities_from_help((FIXTURES / "sglang-0.5.16-help.txt").read_text())["algorithms"]
    config = nextn_config()
    config["model"]["load_format"] = "dummy"
    config["sglang"] = {"options_table": "0.5.16"}
    config = validated(config)
    methods = {m.name: m for m in expand_methods(config)}
    assert list(methods) == ["ar", "mtp-s1", "mtp-s3", "mtp-forced"]
    for name in ("mtp-s1", "mtp-s3", "mtp-forced"):
        job = server_job(config, 1, name)
        args = server_arguments(job, 30000, 16384)
        check_argv(args, "0.5.16", config["sglang"]["extra_flags"])
        assert algorithms.flag_value(args, "--speculative-algorithm") == "NEXTN"
        assert "--speculative-draft-model-path" not in args  # SGLang finds the head in the target's checkpoint
        assert algorithms.flag_value(args, "--speculative-draft-load-format") == "dummy"  # the head's weights too
        argv, env = launch_command(job, 30000, 16384)
        decoding = decoding_from_args(parse_args(argv[3:]), env)
        assert decoding.algorithm == "nextn" and decoding.params() == methods[name].params
    # forced acceptance as for EAGLE: SGLANG_SIMULATE_ACC_LEN on the server, read back by the simulated one
    assert launch_command(server_job(config, 1, "mtp-forced"), 30000, 16384)[1]["SGLANG_SIMULATE_ACC_LEN"] == "2.5"
    assert methods["mtp-forced"].decoding.accept_length == FORCED
    assert methods["mtp-s3"].shape() == ("chain", 1) and methods["mtp-s3"].verify_width() == 4
    # a head sized from the target as EAGLE's is (one layer and the LM head, no fused layers)
    cost = CostModel.named("H200", "qwen3-8b")
    head = {"topk": 1, "num_steps": 3, "num_draft_tokens": 4}
    contexts = [1000] * 4
    assert cost.draft_seconds(Decoding("nextn", **head), contexts) == cost.draft_seconds(
        Decoding("eagle", **head), contexts
    )
    # there is no drafter to name
    named = nextn_config()
    named["methods"][1]["drafter"] = "some/head"
    with pytest.raises(cfg.ConfigError, match=r"methods\[1\] \(mtp\): algorithm 'nextn' drafts with the target's own"):
        validated(named)


def test_nextn_runs_end_to_end_on_the_simulator(workflow):
    write_config(workflow, nextn_config())
    snakemake(workflow, "results/report/data.json")
    summary = pd.read_csv(workflow / "results" / "summary.csv")
    nextn = summary[summary["algorithm"] == "nextn"].set_index(["method", "concurrency"])
    assert sorted(set(nextn.index.get_level_values("method"))) == ["mtp-forced", "mtp-s1", "mtp-s3"]
    assert (nextn["requests_failed"] == 0).all() and nextn["speedup"].notna().all()  # over the AR cells
    assert (nextn["verify_width"].loc["mtp-s1"] == 2).all() and (nextn["tree_mode"] == "chain").all()
    drawn = nextn["acceptance_length"]
    assert (drawn.loc["mtp-s1"] > 1).all() and (drawn.loc["mtp-s3"] > drawn.loc["mtp-s1"]).all()
    assert drawn.loc["mtp-forced"].to_numpy() == pytest.approx(FORCED, rel=0.05)  # the last round may be cut short
    for path in (workflow / "results" / "cells" / "tp1").glob("mtp*/short/c*.json"):
        cell = json.loads(path.read_text())
        validate_cell(cell)  # the cell schema knows the algorithm
        assert cell["method"]["algorithm"] == "nextn" and "drafter" not in cell["method"]
    # the report's sweep charts take it as they take every draft model: its draft tokens against acceptance
    data = json.loads((workflow / "results" / "report" / "data.json").read_text())
    assert any(name.startswith("sweep-nextn-acceptance-short-tp1") for name in data["csv"]), sorted(data["csv"])
    # the forced method is stamped: its acceptance is the server's switch, not a head's, and its cells are artefacts
    stamp = data["context"]["verdict"]["stamp"]
    assert stamp["flags"] == ["SIMULATED", "ACCEPTANCE FORCED"]
    assert f"Acceptance forced on mtp-forced ({FORCED:g})" in " ".join(stamp["caveats"])
    assert summary.set_index("method").loc["mtp-forced", "accept_length"].eq(FORCED).all()
    assert "SIMULATED BACKEND: not measured on GPUs / ACCEPTANCE FORCED" == data["context"]["footer_flags"]
    # its break-even acceptance, one forced length: said against that length, and marked simulated in the report
    breakeven = pd.read_csv(workflow / "results" / "break_even_acceptance.csv", dtype={"forced_lengths": str})
    assert list(breakeven["family"]) == ["mtp-forced"] * 2 and breakeven["simulated"].all()
    assert set(breakeven["forced_lengths"]) == {f"{FORCED:g}"}
    assert set(breakeven["outcome"]) <= {verdict.BELOW, verdict.ABOVE, verdict.NOT_DECIDED}
    assert data["context"]["has_forced_break_even"] and not data["context"]["forced_measured"]
    assert data["context"]["forced_how"] == "by the simulator's forced drafter on the simulated backend"
