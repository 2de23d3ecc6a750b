"""Bad input stops the workflow before any job runs, naming the key, file or method and what to do (real Snakemake
runs).
"""

from __future__ import annotations

import pytest

from conftest import load_default_config, snakemake, write_config


INVALID = [
    ("unknown-algorithm", lambda c: c["methods"].append({"name": "x", "algorithm": "medusa"}), "algorithm"),
    ("tp-zero", lambda c: c.update(tp=[0]), "tp"),
    ("tp-not-integer", lambda c: c.update(tp=["two"]), "tp"),
    ("tp-fraction", lambda c: c.update(tp=[1.5]), "tp"),
    ("concurrency-zero", lambda c: c.update(concurrency=[1, 0]), "concurrency"),
    ("duplicated-method", lambda c: c["methods"].append({"name": "ar", "algorithm": "ar"}), "duplicated method name 'ar'"),
    ("duplicated-after-sweep", lambda c: c["methods"].append({"name": "ddtree-b8", "algorithm": "ddtree", "budget": 8}),
     "duplicated method name 'ddtree-b8'"),
    ("sglang-without-model-path", lambda c: (c.update(backend="sglang"), c["model"].pop("path")), "model.path"),
    ("ddtree-without-budget", lambda c: c["methods"].append({"name": "t", "algorithm": "ddtree"}), "budget"),
    ("unknown-key", lambda c: c.update(concurency=[1]), "concurency"),
    ("negative-warmup", lambda c: c.update(warmup=-1), "warmup"),
    ("zero-requests", lambda c: c["workloads"][0].update(requests=0), "requests"),
    ("empty-methods", lambda c: c.update(methods=[]), "methods"),
    ("empty-tp", lambda c: c.update(tp=[]), "tp"),
    ("concurrency-not-a-list", lambda c: c.update(concurrency="many"), "concurrency"),
    ("unknown-family", lambda c: c["workloads"][0].update(family="poetry"), "family"),
    ("unknown-workload-source", lambda c: c["workloads"][0].update(source="internet"), "source"),
    ("file-source-without-path", lambda c: c["workloads"][0].update(source="file"), "needs 'path'"),
    ("duplicated-workload", lambda c: c["workloads"].append(dict(c["workloads"][0])), "duplicated workload name"),
    ("ddtree-without-drafter-on-sglang", lambda c: (c.update(backend="sglang"), c["model"].pop("drafter")),
     "model.drafter"),
    ("tp-larger-than-gpus", lambda c: c.update(tp=[8], gpu_pool={"devices": 4}), "larger than the 4 GPUs"),
    ("negative-temperature", lambda c: c["sampling"].update(temperature=-0.5), "temperature"),
    ("top-p-zero", lambda c: c["sampling"].update(top_p=0), "top_p"),
    ("poisson-without-rate", lambda c: c.update(load={"model": "poisson"}), "load.rate"),
    ("unknown-protocol", lambda c: c.update(load={"protocol": "grpc"}), "protocol"),
    ("unknown-sim-gpu", lambda c: c["sim"].update(gpu="TPU-v9"), "sim.gpu"),
    ("budget-on-dflash", lambda c: c["methods"][1].update(budget=8), "'budget' has no meaning for algorithm 'dflash'"),
    ("block-size-on-ar", lambda c: c["methods"][0].update(block_size=16), "'block_size' has no meaning"),
    ("bad-api-key-env", lambda c: c.update(server={"api_key_env": "MY KEY"}), "api_key_env"),
    ("method-name-with-slash", lambda c: c["methods"][0].update(name="a/b"), "name"),
    ("max-new-tokens-zero", lambda c: c["workloads"][0].update(max_new_tokens=0), "max_new_tokens"),
    ("string-in-budget-list", lambda c: c["methods"][2].update(budget=[8, "lots"]), "budget"),
]


@pytest.mark.parametrize("name,mutate,key", INVALID, ids=[i[0] for i in INVALID])
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
