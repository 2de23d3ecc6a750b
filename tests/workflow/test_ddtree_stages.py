"""A DDTree build with a stage profiler through a real Snakemake run on the simulated backend: its engine beside
another, its spelling and flags checked, each DDTree cell with the stage records its server wrote during the cell,
the aggregated stage table beside the cost model's split of the same rounds, and the report's table of both."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from conftest import REPO, fast_config, report_text, snakemake, write_config
from specsweep import ddtree_profile


def test_a_profiled_ddtree_build_writes_its_stages_into_each_cell_and_the_report(workflow):
    fork = yaml.safe_load((REPO / "config" / "gpu-ddtree.yaml").read_text())
    config = fast_config(requests=4, max_new_tokens=48)
    config["concurrency"] = [1, 2]
    config["engines"] = [{"name": "release"}, {"name": "fork", "sglang": fork["engines"][1]["sglang"]}]
    config["algorithms"] = {"ddtree": fork["algorithms"]["ddtree"]}
    profiled = next(m for m in fork["methods"] if m["name"] == "ddtree")
    flags = profiled["flags"]
    flags[flags.index("--speculative-ddtree-profile-interval") + 1] = "2"
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {**profiled, "engines": ["fork"], "budget": [15, 16], "flags": flags},
    ]
    write_config(workflow, config)
    snakemake(workflow, "results/report/report.pdf", timeout=300)

    for budget in (15, 16):
        records = ddtree_profile.read_file(workflow / f"results/ddtree-profile/b{budget}.jsonl")
        assert records and all(r["simulated"] for r in records)
        for concurrency in (1, 2):
            cell = json.loads(
                (workflow / f"results/cells/tp1/ddtree-b{budget}@fork/short/c{concurrency}.json").read_text()
            )
            stages = cell["stages"]
            assert stages["rounds"] >= 2 and stages["unknown"] == ["simulated_other"]
            assert stages["meta"]["verify_width"] == pytest.approx(budget + 1)
            assert stages["seconds_per_round"]["verify"] > stages["seconds_per_round"]["follow"] >= 0
    # a cell without the profiler has no stages
    assert "stages" not in json.loads((workflow / "results/cells/tp1/ar@fork/short/c1.json").read_text())

    table = pd.read_csv(workflow / "results" / "ddtree_stages.csv")
    assert sorted(set(table["method"])) == ["ddtree-b15@fork", "ddtree-b16@fork"] and len(table) == 4
    assert table["simulated"].all()
    # the simulated records are the cost model's split of the same rounds: the modelled split at the rounds' mean
    # batch and the cells' mean context is close to them (the records average over the contexts as they grew)
    for part in ("draft", "verify"):
        ratio = table[f"measured_ms_{part}"] / table[f"modelled_ms_{part}"]
        assert ratio.between(0.8, 1.25).all(), (part, list(ratio))
    assert (table.loc[table["budget"] == 16, "measured_ms_round"].values > 0).all()

    text = report_text(workflow)
    assert "Where a DDTree verify round" in text and "Verify*" in text
    assert "simulated_other" in text or "simulated other" in text

    # the width cliff: budget 16 (a verify of 17) against 15 (16, the chain's width) at each concurrency, in the
    # report's words and table; simulated, and said so
    cliff = pd.read_csv(workflow / "results" / "width_cliff.csv")
    assert list(zip(cliff["method"], cliff["reference"], cliff["concurrency"])) == [
        ("ddtree-b16@fork", "ddtree-b15@fork", 1),
        ("ddtree-b16@fork", "ddtree-b15@fork", 2),
    ]
    assert cliff["simulated"].all() and cliff["output_throughput_ratio"].gt(0).all()
    assert "The width cliff" in text and "(a verify of 17 tokens) against" in text
