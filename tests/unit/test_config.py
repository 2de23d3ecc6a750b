"""Configuration: schema validation through Snakemake, coercion, method sweeps, semantic checks."""

from __future__ import annotations

import copy

import pytest
import yaml
from snakemake.exceptions import WorkflowError

from conftest import REPO, SCHEMA, load_default_config, validated
from specsweep import config as cfg
from specsweep.coerce import coerce_to_schema
from specsweep.jobs import MIN_WAVES, all_cells, server_job, servers
from specsweep.methods import expand_methods


def test_budget_list_expands_into_one_method_per_budget():
    config = load_default_config()
    config["methods"] = [{"name": "ddtree", "algorithm": "ddtree", "budget": [4, 8, 15, 16, 32, 64], "topk": 8}]
    methods = expand_methods(validated(config))
    assert [m.name for m in methods] == [f"ddtree-b{b}" for b in (4, 8, 15, 16, 32, 64)]
    b16 = methods[3]
    assert b16.params == {"block_size": 16, "tree_build": "sglang-pr29907", "budget": 16, "topk": 8}
    assert b16.flags[b16.flags.index("--speculative-ddtree-budget") + 1] == "16"
    assert b16.env == {"SGLANG_DDTREE_MAX_TOPK": "8"}


def test_budget_and_topk_sweeps_form_a_grid():
    config = load_default_config()
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": [8, 16], "topk": [4, 8]}]
    names = [m.name for m in expand_methods(validated(config))]
    assert names == ["t-b8-t4", "t-b8-t8", "t-b16-t4", "t-b16-t8"]


def test_algorithm_spelling_is_data():
    config = load_default_config()
    config["algorithms"] = {"ddtree": {"flags": ["--speculative-dflash-enable-ddtree", "--speculative-ddtree-budget", "{budget}"],
                                       "env": {}}}
    config["sglang"] = {"build": "a fork", "extra_flags": [{"flag": "--speculative-dflash-enable-ddtree", "type": "bool"},
                                                          {"flag": "--speculative-ddtree-budget", "type": "int"}]}
    config["methods"] = [{"name": "tree", "algorithm": "ddtree", "budget": 32}]
    (method,) = expand_methods(validated(config))
    # each key given replaces the registry's; the others (here the attention backend) stay
    assert method.flags == ("--speculative-dflash-enable-ddtree", "--speculative-ddtree-budget", "32",
                            "--attention-backend", "triton") and method.env == {}
    config["algorithms"]["ddtree"]["attention_backend"] = None
    (method,) = expand_methods(validated(config))
    assert method.flags == ("--speculative-dflash-enable-ddtree", "--speculative-ddtree-budget", "32")


def test_unknown_placeholder_is_named():
    config = load_default_config()
    config["methods"] = [{"name": "d", "algorithm": "dflash", "flags": ["--x", "{budgt}"]}]
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\] \(d\).*budgt"):
        validated(config)


def test_tree_build_is_a_known_build_and_only_for_ddtree():
    config = load_default_config()
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 8, "tree_build": "paper"},
                         {"name": "u", "algorithm": "ddtree", "budget": 8}]
    paper, default = expand_methods(validated(config))
    assert paper.params["tree_build"] == "paper" and default.params["tree_build"] == "sglang-pr29907"
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 8, "tree_build": "my-fork"}]
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\] \(t\)\.tree_build.*my-fork.*known builds: paper, sglang-pr29907"):
        validated(config)
    config["methods"] = [{"name": "d", "algorithm": "dflash", "tree_build": "paper"}]
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\] \(d\): 'tree_build' has no meaning for algorithm 'dflash'"):
        validated(config)


def test_config_strings_are_coerced_to_schema_types():
    # what `snakemake --config tp=[1,4] warmup=2 sampling={temperature: 0}` delivers
    raw = {"tp": ["1", "4"], "warmup": "2", "sampling": {"temperature": "0"}, "model": {"name": "8"},
           "methods": [{"name": "d", "algorithm": "ddtree", "budget": ["8", "16"]}]}
    out = coerce_to_schema(raw, SCHEMA)
    assert out["tp"] == [1, 4] and out["warmup"] == 2
    assert out["sampling"]["temperature"] == 0.0 and isinstance(out["sampling"]["temperature"], float)
    assert out["model"]["name"] == "8"  # strings stay strings where the schema wants one
    assert out["methods"][0]["budget"] == [8, 16]


def test_equivalent_configs_give_identical_server_params():
    a = load_default_config()
    b = copy.deepcopy(a)
    b["sampling"]["temperature"] = 0  # int instead of float
    b = dict(reversed(list(b.items())))  # key order
    ca, cb = validated(a), validated(b)
    for server in servers(ca):
        assert server_job(ca, server["tp"], server["method"]) == server_job(cb, server["tp"], server["method"])


def test_full_plan_has_36_servers_and_1080_cells_that_hold_their_concurrency():
    config = validated(yaml.safe_load((REPO / "config" / "plan-full.yaml").read_text()))
    assert len(servers(config)) == 36
    cells = all_cells(config)
    assert len(cells) == 1080 and len({c["path"] for c in cells}) == 1080
    assert all(c["requests"] >= 4 * c["concurrency"] or c["workload"] == "agentic-1" for c in cells)
    assert all(c["requests"] >= MIN_WAVES * c["concurrency"] for c in cells)
    assert max(c["requests"] for c in cells) == 256  # 4 x 64


def test_default_sizing_scales_with_concurrency():
    config = validated(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    sizes = {(c["workload"], c["concurrency"]): c["requests"] for c in all_cells(config)}
    assert sizes[("short", 1)] == 32 and sizes[("short", 4)] == 32 and sizes[("short", 16)] == 64
    assert sizes[("agent", 1)] == 16 and ("agent", 16) not in sizes  # its own levels: too few recorded sessions


@pytest.mark.parametrize("change, words", [
    (lambda c: c["workloads"].__setitem__(0, {"name": "short", "family": "short", "requests": 16}),
     ["short at concurrency 16", "16 sessions", "at least 32", "workloads[0].requests", "workloads[0].concurrency"]),
    (lambda c: c["workloads"][2].update(concurrency=[1, 4, 16], requests=40),
     ["agent at concurrency 1", "24 distinct", "replaying", "workloads[2].concurrency"]),
])
def test_cells_that_cannot_hold_their_label_are_rejected_naming_cell_and_fix(change, words):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    change(config)
    with pytest.raises(cfg.ConfigError) as info:
        validated(config)
    for word in words:
        assert word in str(info.value)


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
    ("ddtree-depth-bonus-not-a-number", lambda c: c["methods"].append(
        {"name": "t", "algorithm": "ddtree", "budget": 32, "env": {"SGLANG_DDTREE_DEPTH_BONUS": "deep"}}),
     "SGLANG_DDTREE_DEPTH_BONUS='deep' is not a number"),
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
def test_invalid_config_is_rejected_naming_the_key(name, mutate, key):
    """The Snakefile's own steps (coercion, schema validation with defaults, checks) refuse each mistake, naming
    its key (tests/workflow/test_bad_input.py runs one of each layer through Snakemake)."""
    config = load_default_config()
    mutate(config)
    with pytest.raises((WorkflowError, cfg.ConfigError)) as info:
        validated(config)
    assert key in str(info.value)
