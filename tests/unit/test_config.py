"""Configuration: schema validation through Snakemake, coercion, method sweeps, semantic checks."""

from __future__ import annotations

import copy
import json
import re

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
    config["algorithms"] = {
        "ddtree": {
            "flags": ["--speculative-dflash-enable-ddtree", "--speculative-ddtree-budget", "{budget}"],
            "env": {},
        }
    }
    config["sglang"] = {
        "build": "a fork",
        "extra_flags": [
            {"flag": "--speculative-dflash-enable-ddtree", "type": "bool"},
            {"flag": "--speculative-ddtree-budget", "type": "int"},
        ],
    }
    config["methods"] = [{"name": "tree", "algorithm": "ddtree", "budget": 32}]
    (method,) = expand_methods(validated(config))
    # each key given replaces the registry's; the others (here the attention backend) stay
    assert (
        method.flags
        == ("--speculative-dflash-enable-ddtree", "--speculative-ddtree-budget", "32", "--attention-backend", "triton")
        and method.env == {}
    )
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
    config["methods"] = [
        {"name": "t", "algorithm": "ddtree", "budget": 8, "tree_build": "paper"},
        {"name": "u", "algorithm": "ddtree", "budget": 8},
    ]
    paper, default = expand_methods(validated(config))
    assert paper.params["tree_build"] == "paper" and default.params["tree_build"] == "sglang-pr29907"
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 8, "tree_build": "my-fork"}]
    with pytest.raises(
        cfg.ConfigError,
        match=r"methods\[0\] \(t\)\.tree_build.*my-fork.*known builds: paper, rancy-wang-ddtree-v2, sglang-pr29907",
    ):
        validated(config)
    config["methods"] = [{"name": "d", "algorithm": "dflash", "tree_build": "paper"}]
    with pytest.raises(
        cfg.ConfigError, match=r"methods\[0\] \(d\): 'tree_build' has no meaning for algorithm 'dflash'"
    ):
        validated(config)


def test_config_strings_are_coerced_to_schema_types():
    # what `snakemake --config tp=[1,4] warmup=2 sampling={temperature: 0}` delivers
    raw = {
        "tp": ["1", "4"],
        "warmup": "2",
        "sampling": {"temperature": "0"},
        "model": {"name": "8"},
        "methods": [{"name": "d", "algorithm": "ddtree", "budget": ["8", "16"]}],
    }
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
    assert sizes[("agent", 1)] == 8 and ("agent", 16) not in sizes  # its own levels: too few recorded sessions
    assert sizes[("long", 1)] == sizes[("long", 4)] == 16 and ("long", 16) not in sizes  # its own count and levels


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda c: c["workloads"].__setitem__(0, {"name": "short", "family": "short", "requests": 16}),
            [
                "short at concurrency 16",
                "16 sessions",
                "at least 32",
                "workloads[0].requests",
                "workloads[0].concurrency",
            ],
        ),
        (
            lambda c: c["workloads"][2].update(concurrency=[1, 4, 16], requests=40),
            ["agent at concurrency 1", "24 distinct", "replaying", "workloads[2].concurrency"],
        ),
    ],
)
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
    (
        "duplicated-method",
        lambda c: c["methods"].append({"name": "ar", "algorithm": "ar"}),
        "duplicated method name 'ar'",
    ),
    (
        "duplicated-after-sweep",
        lambda c: c["methods"].append({"name": "ddtree-b8", "algorithm": "ddtree", "budget": 8}),
        "duplicated method name 'ddtree-b8'",
    ),
    ("sglang-without-model-path", lambda c: (c.update(backend="sglang"), c["model"].pop("path")), "model.path"),
    ("ddtree-without-budget", lambda c: c["methods"].append({"name": "t", "algorithm": "ddtree"}), "budget"),
    (
        "ddtree-depth-bonus-not-a-number",
        lambda c: c["methods"].append(
            {"name": "t", "algorithm": "ddtree", "budget": 32, "env": {"SGLANG_DDTREE_DEPTH_BONUS": "deep"}}
        ),
        "SGLANG_DDTREE_DEPTH_BONUS='deep' is not a number",
    ),
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
    (
        "ddtree-without-drafter-on-sglang",
        lambda c: (c.update(backend="sglang"), c["model"].pop("drafter")),
        "model.drafter",
    ),
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
    (
        "unknown-acceptance-key",
        lambda c: c["sim"].update(acceptance={"bsae": 0.5}),
        "sim.acceptance.bsae: not a parameter of the acceptance model; known: base, batch_numerics, cap, depth_decay",
    ),
    (
        "pass-env-of-a-decoding-variable",
        lambda c: c.update(server={"pass_env": ["HTTPS_PROXY", "SGLANG_DDTREE_MAX_TOPK"]}),
        "server.pass_env[1]: SGLANG_DDTREE_MAX_TOPK changes how SGLang decodes, so its value must come from the "
        "configuration, where it is part of the cells' keys, not from the shell: set it in server.env",
    ),
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


# ------------------------------------------------------------------ values a schema cannot see, bounds, types


def checked(config: dict) -> dict:
    """The Snakefile's whole sequence: the values walked (size, NaN, infinity, NUL), then coercion, schema
    validation and the checks (validated); a schema error is cut to its key and reason as the workflow cuts it."""
    from jsonschema import ValidationError

    cfg.check_values(config)
    try:
        return validated(config)
    except WorkflowError as error:
        if isinstance(error.__context__, ValidationError):
            raise cfg.ConfigError(cfg.schema_error(error.__context__)) from None
        raise


NON_FINITE = [
    ("sampling.temperature", lambda c, x: c["sampling"].update(temperature=x)),
    ("load.think_time", lambda c, x: c.update(load={"think_time": x})),
    ("load.rate", lambda c, x: c.update(load={"model": "poisson", "rate": x})),
    ("sim.faults.error_rate", lambda c, x: c["sim"].update(faults={"error_rate": x})),
    ("adaptive.target", lambda c, x: c.update(adaptive={"enabled": True, "target": x})),
    ("server.request_timeout", lambda c, x: c.update(server={"request_timeout": x})),
    ("sim.acceptance.base", lambda c, x: c["sim"].update(acceptance={"base": x})),
    ("methods[1].env.SGLANG_X", lambda c, x: c["methods"][1].update(env={"SGLANG_X": x})),
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key,mutate", NON_FINITE, ids=[k for k, _ in NON_FINITE])
def test_nan_and_infinity_are_refused_naming_the_key(key, mutate, value):
    config = load_default_config()
    mutate(config, value)
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    assert str(info.value).startswith(f"{key}: {value} is not a finite number")


# each of these made the run or its plan go on for ever (or fail only inside a job); now refused at config time
ENDLESS = [
    ("block-size", lambda c: c["methods"][1].update(block_size=100000), "methods[1].block_size: 100000 is greater"),
    ("warmup", lambda c: c.update(warmup=1000000), "warmup: 1000000 is greater than the maximum of 1000"),
    (
        "poisson-rate",
        lambda c: c.update(load={"model": "poisson", "rate": 1e-300}),
        "load.rate: 1e-300 is less than the minimum of 0.001",
    ),
    (
        "max-new-tokens",
        lambda c: c["workloads"][0].update(max_new_tokens=1e9),
        "workloads[0] (short).max_new_tokens: 1000000000 leaves no room for a prompt in model.context_length 40960",
    ),
    ("requests", lambda c: c["workloads"][0].update(requests=10**7), "workloads[0].requests: 10000000 is greater"),
    (
        "waves",
        lambda c: c.update(load={"waves": 999}, workloads=[{"name": "long", "family": "long", "concurrency": [16]}]),
        "cell long at concurrency 16 (workloads[0]): 15984 sessions is more than the 10000 a cell may send",
    ),
    (
        "topk",
        lambda c: c["methods"].append(
            {"name": "e", "algorithm": "eagle3", "drafter": "x", "topk": 64, "num_steps": 2, "num_draft_tokens": 8}
        ),
        "methods[3].topk: 64 is greater",
    ),
    (
        "num-steps",
        lambda c: c["methods"].append({"name": "e", "algorithm": "eagle3", "drafter": "x", "num_steps": 100000}),
        "methods[3].num_steps: 100000 is greater",
    ),
    ("repetitions", lambda c: c.update(repetitions=10**6), "repetitions: 1000000 is greater than the maximum of 100"),
    ("think-time", lambda c: c.update(load={"think_time": 1e300}), "load.think_time: 1e+300 is greater"),
]


# what a name becomes: folders and files (a 240-character method name measured every cell, then failed on its run
# record's temporary file with ENAMETOOLONG)
LONG = "m" * 240
A_BUILD = {"source": "a fork", "spine_mode": False, "width": "topk", "max_topk": 4, "depth_bonus": 0.0}
ENDLESS += [
    ("method-name", lambda c: c["methods"][0].update(name=LONG), f"methods[0].name: '{LONG}' is too long"),
    ("engine-name", lambda c: c.update(engines=[{"name": "e" * 65}]), f"engines[0].name: '{'e' * 65}' is too long"),
    ("workload-name", lambda c: c["workloads"][0].update(name="w" * 65), "workloads[0].name: 'www"),
    (
        "expanded-name",
        lambda c: c.update(
            methods=[{"name": "t" * 60, "algorithm": "ddtree", "budget": [8, 4096], "topk": [4, "uncapped"]}],
            engines=[{"name": "base"}, {"name": "e" * 64}],
        ),
        f"methods[0] ({'t' * 60}): its server's name '{'t' * 60}-b8-t4@{'e' * 64}' (131 characters, its sweep tags "
        "and engine included) is longer than the 128 a name that becomes a folder and file names may have; shorten "
        "methods[0].name or engines[1].name",
    ),
    (
        "ddtree-build-named-empty",
        lambda c: c.update(ddtree_builds={"": {**A_BUILD, "early_stop_margin": None}}),
        "ddtree_builds: '' does not match",
    ),
    ("tree-build-empty", lambda c: c["methods"][2].update(tree_build=""), "methods[2].tree_build: '' does not match"),
    (
        "depth-bonus-env-path",
        lambda c: (
            c.update(ddtree_builds={"mine": {**A_BUILD, "early_stop_margin": None, "depth_bonus_env": "PATH"}}),
            c["methods"][2].update(tree_build="mine"),
        ),
        "ddtree_builds.mine.depth_bonus_env: 'PATH' is not a variable of SGLang's kind (SGLANG_..., which only the "
        "configuration sets and the cells' keys hold)",
    ),
]


@pytest.mark.parametrize("name,mutate,message", ENDLESS, ids=[e[0] for e in ENDLESS])
def test_values_that_never_end_are_refused_at_config_time(name, mutate, message):
    config = load_default_config()
    mutate(config)
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    assert str(info.value).startswith(message), str(info.value)


def test_whole_numbers_written_as_floats_are_the_integers_they_mean():
    """JSON Schema counts 4.0 as an integer: without coercion it passed validation and reached a server's flags as
    '4.0' (blamed on a method's flags) or a cell's loop as a float."""
    config = load_default_config()
    config.update(concurrency=[1, 4.0], seed=1e3)  # what YAML's 4.0 and `--config seed=1e3` deliver
    config["workloads"][2]["requests"] = 8.0
    checked_config = checked(config)
    assert checked_config["concurrency"] == [1, 4] and all(type(c) is int for c in checked_config["concurrency"])
    assert checked_config["seed"] == 1000 and type(checked_config["seed"]) is int
    assert checked_config["workloads"][2]["requests"] == 8
    job = server_job(checked_config, 1, "ar")
    assert job == server_job(validated(dict(load_default_config(), concurrency=[1, 4], seed=1000)), 1, "ar")
    config["concurrency"] = [1, 4.5]
    with pytest.raises(cfg.ConfigError, match=r"^concurrency\[1\]: 4.5 is not of type 'integer'"):
        checked(config)


@pytest.mark.parametrize(
    "key,mutate",
    [
        ("methods[0].name", lambda c: c["methods"][0].update(name="ar\n")),
        ("workloads[0].name", lambda c: c["workloads"][0].update(name="short\n")),
        ("server.api_key_env", lambda c: c.update(server={"api_key_env": "KEY\n"})),
    ],
)
def test_a_name_ending_in_a_newline_is_refused(key, mutate):
    config = load_default_config()
    mutate(config)
    with pytest.raises(cfg.ConfigError, match=rf"^{re.escape(key)}: '.*\\n' does not match"):
        checked(config)


@pytest.mark.parametrize(
    "key,mutate",
    [
        ("server.env.A", lambda c: c.update(server={"env": {"A": "x\0y"}})),
        ("methods[1].flags[0]", lambda c: c["methods"][1].update(flags=["--x\0"])),
        ("model.path", lambda c: c["model"].update(path="/models/\0")),
    ],
)
def test_a_nul_character_is_refused_at_config_time_naming_the_key(key, mutate):
    config = load_default_config()
    mutate(config)
    with pytest.raises(cfg.ConfigError, match=rf"^{re.escape(key)}: the value holds a NUL character"):
        checked(config)


def test_a_yaml_anchor_bomb_is_refused_naming_its_key_without_printing_it():
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]  # 10^6 values from 6 lines
    config = load_default_config()
    config["bomb"] = yaml.safe_load("\n".join(lines))["a5"]
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    message = str(info.value)
    assert message.startswith(f"bomb: the configuration holds more than {cfg.MAX_VALUES} values") and len(message) < 400


def test_schema_errors_are_cut_to_the_key_and_the_reason():
    config = load_default_config()
    config["concurency"] = [1]
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    assert str(info.value).startswith("concurency: not a key of the configuration; known: adaptive, algorithms,")
    config = load_default_config()
    config["workloads"][0]["requests"] = list(range(5000))  # a long value: its reason is cut short
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    assert str(info.value).startswith("workloads[0].requests: [0, 1, 2") and len(str(info.value)) < 400


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda c: c["methods"][2].update(budget=[8, "lots"]), "methods[2].budget[1]: 'lots' is not of type 'integer'"),
        (lambda c: c["methods"][2].update(budget=5000), "methods[2].budget: 5000 is greater than the maximum of 4096"),
        (
            lambda c: c.update(server={"min_free_slots_delay": 1}),
            "server.min_free_slots_delay: 1 is less than the minimum",
        ),
    ],
)
def test_a_value_of_none_of_a_keys_forms_gets_the_reason_of_the_closest(mutate, message):
    config = load_default_config()
    mutate(config)
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    assert str(info.value).startswith(message), str(info.value)


# ------------------------------------------------------------------ folders the workflow writes into


@pytest.mark.parametrize(
    "key,mutate,message",
    [
        ("cache_dir", lambda c: c.update(cache_dir=""), "empty"),
        ("cache_dir", lambda c: c.update(cache_dir="  "), "empty"),
        ("cache_dir", lambda c: c.update(cache_dir="/"), "the filesystem root"),
        ("cache_dir", lambda c: c.update(cache_dir="//"), "the filesystem root"),
        ("cache_dir", lambda c: c.update(cache_dir="/tmp/.."), "the filesystem root"),
        ("cache_dir", lambda c: c.update(cache_dir="."), "the working folder or one above it"),
        ("cache_dir", lambda c: c.update(cache_dir=".."), "the working folder or one above it"),
        ("gpu_pool.lock_dir", lambda c: c.update(gpu_pool={"lock_dir": ""}), "empty"),
        ("sglang.env_dir", lambda c: c.update(sglang={"env_dir": "/"}), "the filesystem root"),
    ],
    ids=["empty", "blank", "root", "double-slash", "root-by-dots", "working-folder", "above", "lock-dir", "env-dir"],
)
def test_folders_are_never_empty_or_the_filesystem_root(key, mutate, message):
    config = load_default_config()
    mutate(config)
    with pytest.raises(cfg.ConfigError, match=rf"^{re.escape(key)}: .*{message}"):
        checked(config)


def test_a_cache_of_its_own_anywhere_is_accepted(tmp_path):
    for folder in ("results/cache", str(tmp_path / "shared-cache"), "../elsewhere/cache"):
        assert checked(dict(load_default_config(), cache_dir=folder))["cache_dir"] == folder


# ------------------------------------------------------------------ configuration files


@pytest.mark.parametrize(
    "text,message",
    [
        ("warmup: 2\nseed: 0\nwarmup: 5\n", "line 3: duplicated key 'warmup' (first given at line 1)"),
        (
            "sampling:\n  temperature: 0.0\n  top_p: 1.0\n  temperature: 0.7\n",
            "line 4: duplicated key 'temperature' (first given at line 2)",
        ),
        (
            "methods:\n  - {name: ar, algorithm: ar, name: dflash}\n",
            "line 2: duplicated key 'name' (first given at line 2)",
        ),
        ('{"warmup": 2, "warmup": 3}', "duplicated key 'warmup'; keep one of them (JSON"),
    ],
    ids=["top-level", "nested", "flow-mapping", "json"],
)
def test_a_key_given_twice_in_a_config_file_is_refused_naming_file_line_and_key(tmp_path, text, message):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(cfg.ConfigError) as info:
        cfg.read_config_file(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_config_files_without_repeated_keys_read_as_yaml_does(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &base {block_size: 16, topk: 8}\nddtree: {<<: *base, topk: 4}\n")
    assert cfg.read_config_file(path) == yaml.safe_load(path.read_text())
    for name in ("config.yaml", "plan-full.yaml", "gpu-check.yaml", "gpu-spec.yaml", "gpu-ddtree.yaml"):
        assert cfg.read_config_file(REPO / "config" / name) == yaml.safe_load((REPO / "config" / name).read_text())


def test_a_whole_float_is_an_integer_also_in_a_key_of_several_forms():
    config = load_default_config()
    config["server"] = {"min_free_slots_delay": 4.0}  # disabled, sglang or an integer
    config["methods"][2]["budget"] = [8.0, 32]
    checked_config = checked(config)
    assert type(checked_config["server"]["min_free_slots_delay"]) is int
    assert [m.name for m in expand_methods(checked_config)][2:] == ["ddtree-b8", "ddtree-b32"]


# ------------------------------------------------------------------ an engine's sim block


def two_engines(sim: dict) -> dict:
    """The default configuration on two engines, the second with these sim keys."""
    config = load_default_config()
    config["engines"] = [{"name": "base"}, {"name": "other", "sim": sim}]
    return config


# each was accepted (and ignored, or failed when the server started, or raised a bare ZeroDivisionError/TypeError)
ENGINE_SIM = [
    ("unknown-key", {"gpuu": "H100"}, "engines[1].sim.gpuu: not a key of engines[1].sim; known: acceptance,"),
    ("acceptance-key", {"acceptance": {"bsae": 0.5}}, "engines[1].sim.acceptance.bsae: not a parameter of the"),
    ("fault", {"faults": {"explode": 1}}, "engines[1].sim.faults.explode: not a key of engines[1].sim.faults"),
    ("tokenizer", {"tokenizer": "bogus"}, "engines[1].sim.tokenizer: 'bogus' is not one of ['model', 'approximate']"),
    ("time-scale-zero", {"time_scale": 0}, "engines[1].sim.time_scale: 0.0 is less than or equal to the minimum"),
    ("time-scale-word", {"time_scale": "fast"}, "engines[1].sim.time_scale: 'fast' is not of type 'number'"),
    ("gpu", {"gpu": "H100x"}, "engines[1].sim.gpu: unknown profile 'H100x'; known: A800, B200, H100, H200"),
    ("runtime", {"runtime": "slow"}, "engines[1].sim.runtime: unknown profile 'slow'"),
    (
        "clock",
        {"time_scale": 2},
        "engines[1].sim.time_scale: 2 (engine other) differs from engines[0].sim.time_scale 1",
    ),
]


@pytest.mark.parametrize("name,sim,message", ENGINE_SIM, ids=[c[0] for c in ENGINE_SIM])
def test_an_engines_sim_block_is_checked_as_the_top_level_one_naming_its_key(name, sim, message):
    with pytest.raises(cfg.ConfigError) as info:
        checked(two_engines(sim))
    assert str(info.value).startswith(message), str(info.value)


def test_a_calibration_an_engine_names_that_is_not_there_is_named_as_its_key(tmp_path):
    """Chosen when the workflow starts (the Snakefile resolves the cost models, then each engine's): it used to fail
    while Snakemake built the DAG, with a traceback naming sim.calibration."""
    from specsweep.calibration import choose

    missing = tmp_path / "gone.yaml"
    config = choose.resolve(checked(two_engines({"calibration": str(missing)})))
    with pytest.raises(cfg.ConfigError) as info:
        cfg.check_engine_calibrations(config)
    assert str(info.value).startswith(f"engines[1].sim.calibration: '{missing}' is neither auto, none, nor a")
    cfg.check_engine_calibrations(choose.resolve(checked(two_engines({"calibration": "none"}))))


def test_a_mistake_in_the_top_level_sim_block_is_named_there_with_engines_configured():
    # every engine's block holds the top-level keys it does not set: the top-level key is the one named
    for mutate, message in (
        (lambda c: c["sim"].update(time_scale=0), "sim.time_scale: 0.0 is less than or equal to the minimum"),
        (lambda c: c["sim"].update(gpuu="H100"), "sim.gpuu: not a key of sim"),
        (lambda c: c["sim"].update(gpu="TPU"), "sim.gpu: unknown profile 'TPU'"),
        (lambda c: c["sim"].update(acceptance={"bsae": 1}), "sim.acceptance.bsae: not a parameter"),
    ):
        config = two_engines({"runtime": "hf-eager"})
        mutate(config)
        with pytest.raises(cfg.ConfigError) as info:
            checked(config)
        assert str(info.value).startswith(message), str(info.value)


def test_config_strings_in_an_engines_sim_block_are_coerced_to_the_schemas_types():
    raw = {"engines": [{"name": "a", "sim": {"time_scale": "2", "faults": {"error_rate": "0.5", "crash_after": "3"}}}]}
    sim = coerce_to_schema(raw, SCHEMA)["engines"][0]["sim"]
    assert sim == {"time_scale": 2.0, "faults": {"error_rate": 0.5, "crash_after": 3}}
    assert isinstance(sim["time_scale"], float) and isinstance(sim["faults"]["crash_after"], int)


def test_an_engines_sim_block_is_merged_over_the_top_level_one_at_every_depth():
    """A top-level acceptance parameter and profile reach an engine that sets its own (they used to be dropped, the
    profile then called unknown), and a default never replaces a top-level key the engine does not set."""
    from specsweep.launcher import launch_command
    from specsweep.modelling.profiles import profiles

    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}, {"name": "dflash", "algorithm": "dflash"}]
    mine = {**profiles()["gpus"]["H200"], "hbm_bandwidth": 2.0e12}
    config["sim"].update(gpu="mine", profiles={"gpus": {"mine": mine}}, acceptance={"base": 0.7}, startup_seconds=2)
    slow = {**profiles()["runtimes"]["sglang"], "bandwidth_efficiency": 0.4}
    config["engines"] = [
        {"name": "base"},
        {
            "name": "slow",
            "sim": {"runtime": "slow", "profiles": {"runtimes": {"slow": slow}}, "acceptance": {"gain": 0.5}},
        },
    ]
    c = checked(config)
    argv, _ = launch_command(server_job(c, 1, "dflash@slow"), port=30000, max_context=8192)

    def value(flag):
        return argv[argv.index(flag) + 1]

    assert json.loads(value("--sim-acceptance")) == {"base": 0.7, "gain": 0.5}
    assert json.loads(value("--sim-profiles")) == {"gpus": {"mine": mine}, "runtimes": {"slow": slow}}
    assert (value("--sim-gpu"), value("--sim-runtime"), value("--sim-startup-seconds")) == ("mine", "slow", "2.0")
    assert value("--sim-tokenizer") == "approximate"  # load_default_config's top-level key, not the default
    base, _ = launch_command(server_job(c, 1, "dflash@base"), port=30000, max_context=8192)
    assert json.loads(base[base.index("--sim-acceptance") + 1]) == {"base": 0.7}
    assert base[base.index("--sim-runtime") + 1] == "sglang"


# ------------------------------------------------------------------ did you mean, the concurrency advice, warnings


@pytest.mark.parametrize(
    "mutate,message,meant",
    [
        (
            lambda c: c.update(concurency=[1]),
            "concurency: not a key of the configuration; known: adaptive,",
            "concurrency",
        ),
        (
            lambda c: (c["methods"][0].update(algoritm="ar"), c["methods"][0].pop("algorithm")),
            "methods[0].algoritm: not a key of methods[0]; known: accept_length, algorithm,",
            "algorithm",
        ),
        (
            lambda c: c["methods"][2].update(budgett=[8]),
            "methods[2].budgett: not a key of methods[2]; known:",
            "budget",
        ),
        (
            lambda c: c["workloads"][1].update(max_new_token=64),
            "workloads[1].max_new_token: not a key of workloads[1]",
            "max_new_tokens",
        ),
        (lambda c: c["sampling"].update(temprature=0.5), "sampling.temprature: not a key of sampling;", "temperature"),
        (lambda c: c["sim"].update(acceptance={"bsae": 0.5}), "sim.acceptance.bsae: not a parameter of the", "base"),
        (lambda c: c["sim"].update(gpu="H20O"), "sim.gpu: unknown profile 'H20O'; known:", "H200"),
    ],
    ids=["top-level", "method", "method-sweep", "workload", "sampling", "acceptance", "profile"],
)
def test_a_misspelt_key_is_answered_with_the_closest_known_one(mutate, message, meant):
    config = load_default_config()
    mutate(config)
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    assert str(info.value).startswith(message), str(info.value)
    assert str(info.value).endswith(f"; did you mean {meant}?"), str(info.value)


def test_a_key_close_to_no_known_one_gets_no_guess():
    config = load_default_config()
    config["sampling"]["zzzz"] = 1
    with pytest.raises(cfg.ConfigError) as info:
        checked(config)
    assert str(info.value) == "sampling.zzzz: not a key of sampling; known: ignore_eos, temperature, thinking, top_p"


def refusal(config: dict) -> str:
    with pytest.raises(cfg.ConfigError) as info:
        validated(config)
    return str(info.value)


def test_concurrency_above_what_a_source_holds_is_refused_with_advice_that_works():
    """Concurrency 256 on the short workload (256 distinct sessions) used to get "set workloads[0].requests to at
    most 256 (and at least 512)", blaming workloads[0].concurrency, which the user had not set: no request count
    holds 256 requests in flight on 256 sessions, and the level came from the top-level concurrency."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["concurrency"] = [1, 4, 16, 256]
    message = refusal(config)
    assert message.startswith(
        "cell short at concurrency 256 (workloads[0]): needs 1024 sessions but its source has 256"
    )
    assert "(the 1024: load.waves 4 x concurrency 256)" in message
    assert "holds a concurrency of at most 128" in message
    assert "leave 256 out of concurrency, or give workloads[0] a concurrency list of its own, e.g. " in message
    assert "requests" not in message.split("Fix:")[1]  # no request count holds it: none is offered
    assert "at least 512" not in message
    config["workloads"][0]["concurrency"] = [1, 4, 16]  # the fix it gives
    validated(config)


@pytest.mark.parametrize("level,count,requests", [(100, "between 200 and 256", [200, 256]), (128, "256", [256])])
def test_a_request_count_is_offered_only_where_one_holds_the_concurrency(level, count, requests):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["concurrency"] = [1, level]
    config["workloads"] = config["workloads"][:1]
    message = refusal(config)
    assert f"Fix: set workloads[0].requests to {count}, or leave {level} out of concurrency" in message, message
    assert message.endswith(", or lower load.waves to 2, or use a source with more sessions")  # 2 x level sessions
    for n in requests:  # each count it offers holds every level
        config["workloads"][0]["requests"] = n
        validated(config)
    config["workloads"][0]["requests"] = requests[0] - 1
    assert "cannot hold" in refusal(config)
    del config["workloads"][0]["requests"]
    config["load"] = {"waves": 2}  # the other fix it gives
    validated(config)


def test_a_workloads_own_request_count_is_the_fix_where_it_is_the_cause():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["workloads"][2].update(concurrency=[1, 4, 16], requests=40)  # agent: 24 recorded sessions fit
    message = refusal(config)
    assert "needs 40 sessions but its source has 24 distinct ones" in message and "(the 40: workloads[2].requests)" in (
        message
    )
    assert "Fix: lower workloads[2].requests to between 8 and 24 and leave 16 out of workloads[2].concurrency" in (
        message
    )
    config["workloads"][2].update(concurrency=[1, 4], requests=8)
    validated(config)


def test_a_configuration_without_ar_is_warned_that_it_gets_no_speedups():
    config = load_default_config()
    assert cfg.warnings(validated(config)) == []
    config["methods"] = [m for m in config["methods"] if m["algorithm"] != "ar"]
    [warning] = cfg.warnings(validated(config))
    assert warning.startswith("no method runs AR (algorithm: ar), the baseline every speedup is measured against")
    assert "speedup columns of results/summary.csv" in warning and "break-even" in warning
    config = load_default_config()  # engines: each needs its own AR (speedups are taken on the same engine)
    config["engines"] = [{"name": "base"}, {"name": "other"}]
    config["methods"][0]["engines"] = ["base"]
    [warning] = cfg.warnings(validated(config))
    assert warning.startswith("on engine other, no method runs AR")


def test_the_simulated_hosts_gpus_are_a_pool_of_the_runs_own_and_reach_no_gpu_configuration():
    """sim.gpus (config/config.yaml: 3) makes a simulated 3-GPU host: server jobs take GPUs from a pool whose locks
    live in the run's cache (another workflow on the machine never waits for them); gpu_pool.devices, where set,
    wins; on the sglang backend, where config/config.yaml lies under every --configfile, it is ignored; a cell's key
    does not hold it (what a server measures does not depend on how many GPUs its host has)."""
    from specsweep.cells import cell_key

    config = validated(load_default_config())
    job = server_job(config, 1, "ar")
    assert config["sim"]["gpus"] == 3
    assert job.gpu_pool["devices"] == 3 and job.gpu_pool["lock_dir"] == "results/cache/gpu-locks"
    assert "gpus" not in job.sim
    unsimulated = load_default_config()
    unsimulated["sim"]["gpus"] = None
    other = server_job(validated(unsimulated), 1, "ar")
    assert other.gpu_pool["devices"] is None and other.sim == job.sim
    cell = {"workload": "short", "concurrency": 1, "repetition": 0, "requests": 32}
    assert cell_key(job, cell, "p", "e") == cell_key(other, cell, "p", "e")
    given = load_default_config()
    given["gpu_pool"] = {"devices": 2, "lock_dir": "/tmp/locks"}
    assert server_job(validated(given), 1, "ar").gpu_pool["devices"] == 2
    gpu_host = load_default_config()  # a GPU configuration over config/config.yaml keeps its sim block
    gpu_host.update(backend="sglang")
    assert server_job(validated(gpu_host), 1, "ar").gpu_pool["devices"] is None
    wide = load_default_config()
    wide["tp"] = [1, 8]
    assert refusal(wide).startswith("tp: 8 is larger than the 3 GPUs available (sim.gpus, the simulated host's)")
    engines = load_default_config()
    engines["engines"] = [{"name": "a"}, {"name": "b", "sim": {"gpus": 8}}]
    with pytest.raises(cfg.ConfigError, match=r"^engines\[1\].sim.gpus: 8 \(engine b\) differs from sim.gpus 3"):
        checked(engines)
