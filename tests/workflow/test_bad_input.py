"""Bad input stops the workflow before any job runs, naming the key, file or method and what to do (real Snakemake
runs).
"""

from __future__ import annotations

import pytest

from conftest import load_default_config, snakemake, write_config
from unit.test_config import INVALID


# one mistake from each layer that catches them (every one of INVALID is checked in-process by
# tests/unit/test_config.py through the same coercion, schema validation and checks the Snakefile runs)
THROUGH_SNAKEMAKE = ["tp-not-integer", "unknown-key", "duplicated-after-sweep", "tp-larger-than-gpus"]


@pytest.mark.parametrize("name,mutate,key", [i for i in INVALID if i[0] in THROUGH_SNAKEMAKE], ids=THROUGH_SNAKEMAKE)
def test_invalid_config_fails_before_any_job_naming_the_key(workflow, name, mutate, key):
    config = load_default_config()
    mutate(config)
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    output = proc.stdout
    assert key in output, output[-3000:]
    assert not (workflow / "results").exists(), "a job ran despite the invalid configuration"


def test_bad_user_file_stops_the_workflow_before_any_job(workflow, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\nnot json at all\n')
    config = load_default_config()
    config["workloads"] = [{"name": "mine", "family": "short", "source": "file", "path": str(path), "requests": 2}]
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert f"{path}: line 2: not valid JSON" in proc.stdout
    assert not (workflow / "results").exists()


def test_mistyped_flag_in_config_fails_before_any_job_naming_the_method(workflow):
    config = load_default_config()
    config["methods"][1]["flags"] = ["--speculative-draft-attention-backnd", "fa3"]
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert "method 'dflash'" in proc.stdout and "--speculative-draft-attention-backnd" in proc.stdout
    assert not (workflow / "results").exists()
