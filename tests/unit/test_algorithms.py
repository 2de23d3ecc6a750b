"""The algorithm registry: one entry per algorithm decides its parameters, drafter, spelling, shape and simulation;
config mistakes are refused naming the method; an unknown algorithm never runs as another."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from conftest import REPO, SCHEMA, load_default_config, validated
from specsweep import algorithms
from specsweep import config as cfg
from specsweep.jobs import server_job
from specsweep.launcher import launch_command, server_arguments
from specsweep.methods import expand_methods
from specsweep.sglang_options import check_argv, choose_flags
from specsweep.modelling.acceptance import ACCEPTANCE, accepted_tokens, request_drafter
from specsweep.modelling.decoding import Decoding
from specsweep.sim.args import decoding_from_args, parse_args

EAGLE3_TREE = {
    "name": "e3",
    "algorithm": "eagle3",
    "drafter": "heads/eagle3",
    "num_steps": 4,
    "topk": 4,
    "num_draft_tokens": 16,
}


def configured(*methods, **top) -> dict:
    config = load_default_config()
    config["methods"] = list(methods)
    config.update(top)
    return validated(config)


def test_schemas_name_exactly_the_registry():
    """The config schema, the cell schema and the registry list the same algorithms and parameters."""
    method = SCHEMA["properties"]["methods"]["items"]["properties"]
    assert method["algorithm"]["enum"] == list(algorithms.REGISTRY)
    assert set(SCHEMA["properties"]["algorithms"]["properties"]) == set(algorithms.REGISTRY)
    assert set(algorithms.PARAMETER_NAMES) <= set(method)
    cell = json.loads((REPO / "specsweep" / "cell.schema.json").read_text())
    assert cell["properties"]["method"]["properties"]["algorithm"]["enum"] == list(algorithms.REGISTRY)
    sglang = {a.sglang for a in algorithms.REGISTRY.values() if a.sglang}
    assert sglang == {"DFLASH", "DDTREE", "NGRAM", "EAGLE", "EAGLE3", "STANDALONE"}


def test_an_unknown_algorithm_is_refused_everywhere(monkeypatch):
    with pytest.raises(algorithms.AlgorithmError, match="unknown algorithm 'medusa'.*known: ar, dflash, ddtree"):
        algorithms.get("medusa")
    with pytest.raises(algorithms.AlgorithmError):
        Decoding("medusa")
    with pytest.raises(SystemExit):  # the simulated server, like SGLang, refuses an algorithm it does not have
        parse_args(["--model-path", "m", "--speculative-algorithm", "MEDUSA"])
    # an algorithm registered with a mechanism the simulator lacks is refused, never run as another's
    fake = algorithms.DraftModel(
        "medusa",
        "Medusa",
        "MEDUSA",
        algorithms.EAGLE3.parameters,
        drafter="own",
        drafting="heads",
        size="num_draft_tokens",
    )
    monkeypatch.setitem(algorithms.REGISTRY, "medusa", fake)
    decoding = Decoding("medusa", topk=1, num_steps=3, num_draft_tokens=4)
    with pytest.raises(ValueError, match="no drafting mechanism 'heads'"):
        request_drafter(decoding, 0.8, None, ACCEPTANCE, ["a"], ["b"])
    with pytest.raises(ValueError, match="no drafting mechanism 'heads'"):
        accepted_tokens(decoding, 0.8, None)
    # a cell of an algorithm this code does not know stops aggregation
    from specsweep.aggregate import cell_row

    monkeypatch.delitem(algorithms.REGISTRY, "medusa")
    with pytest.raises(algorithms.AlgorithmError, match="medusa"):
        cell_row({"cell": {}, "method": {"algorithm": "medusa", "params": {}}}, "x.json", {})


INVALID = [
    (
        "steps-on-ngram",
        {"name": "n", "algorithm": "ngram", "num_steps": 3},
        r"\(n\): 'num_steps' has no meaning for algorithm 'ngram'",
    ),
    ("budget-on-eagle3", dict(EAGLE3_TREE, budget=8), r"\(e3\): 'budget' has no meaning for algorithm 'eagle3'"),
    (
        "breadth-on-dflash",
        {"name": "d", "algorithm": "dflash", "max_bfs_breadth": 4},
        "'max_bfs_breadth' has no meaning",
    ),
    (
        "eagle3-without-drafter",
        {k: v for k, v in EAGLE3_TREE.items() if k != "drafter"},
        r"\(e3\): algorithm 'eagle3' needs its own draft model: set 'drafter'",
    ),
    ("standalone-without-drafter", {"name": "s", "algorithm": "standalone"}, r"\(s\): .*'drafter'"),
    (
        "drafter-on-ngram",
        {"name": "n", "algorithm": "ngram", "drafter": "x"},
        r"\(n\): algorithm 'ngram' has no drafter; remove 'drafter'",
    ),
    ("drafter-on-ar", {"name": "a", "algorithm": "ar", "drafter": "x"}, r"\(a\): algorithm 'ar' has no drafter"),
    (
        "chain-with-other-tokens",
        dict(EAGLE3_TREE, topk=1, num_draft_tokens=8),
        r"\(e3\): num_draft_tokens 8 with topk 1: .* set num_draft_tokens to 5 or leave it out",
    ),
    (
        "tree-without-tokens",
        {k: v for k, v in EAGLE3_TREE.items() if k != "num_draft_tokens"},
        r"\(e3\): topk 4 drafts a tree: set num_draft_tokens",
    ),
    (
        "tree-too-large",
        dict(EAGLE3_TREE, num_steps=2, topk=2, num_draft_tokens=8),
        r"\(e3\): num_draft_tokens 8 is outside 2 .. 7",
    ),
    (
        "paged-tree-on-flashmla",
        dict(EAGLE3_TREE, attention_backend="flashmla", flags=["--page-size", "16"]),
        r"\(e3\): topk 4 with --page-size 16 on flashmla attention",
    ),
    ("tree-on-trtllm", dict(EAGLE3_TREE, attention_backend="trtllm_mha"), r"\(e3\): topk 4 on trtllm_mha"),
    (
        "paged-ngram-off-flashinfer",
        {"name": "n", "algorithm": "ngram", "flags": ["--page-size", "32"]},
        r"\(n\): --page-size 32 with max_bfs_breadth 10: SGLang runs NGRAM trees on pages .* only with flashinfer",
    ),
    (
        "paged-ngram-equals-form",
        {"name": "n", "algorithm": "ngram", "flags": ["--page-size=16"], "attention_backend": "fa3"},
        r"\(n\): --page-size 16",
    ),
    (
        "tree-on-trtllm-equals-form",
        dict(EAGLE3_TREE, flags=["--attention-backend=trtllm_mha"]),
        r"\(e3\): topk 4 on trtllm_mha",
    ),
    (
        "flag-set-by-the-spelling",
        {"name": "n", "algorithm": "ngram", "flags": ["--speculative-ngram-max-bfs-breadth", "4"]},
        r"\(n\): --speculative-ngram-max-bfs-breadth in flags .* is set by the spelling of algorithm 'ngram'",
    ),
    ("block-size-swept", {"name": "d", "algorithm": "dflash", "block_size": [8, 16]}, "block_size"),
]


@pytest.mark.parametrize("name,method,message", INVALID, ids=[i[0] for i in INVALID])
def test_a_method_its_algorithm_refuses_is_a_config_error_naming_it(name, method, message):
    with pytest.raises((cfg.ConfigError, Exception)) as info:
        configured({"name": "ar", "algorithm": "ar"}, method)
    assert info.type.__name__ in ("ConfigError", "WorkflowError")
    import re

    assert re.search(message, str(info.value)), str(info.value)


def test_server_flags_set_what_the_algorithm_check_sees():
    """--page-size and --attention-backend among the server's flags, which come last on the command line, count
    as what runs."""
    config = load_default_config()
    config["methods"] = [dict(EAGLE3_TREE, attention_backend="flashmla")]
    config["server"] = {"flags": ["--page-size", "64"]}
    with pytest.raises(cfg.ConfigError, match="--page-size 64 on flashmla"):
        validated(config)
    config["methods"][0]["attention_backend"] = "triton"  # a backend that verifies paged trees
    assert expand_methods(validated(config))[0].params["topk"] == 4
    config["server"] = {"flags": ["--attention-backend", "trtllm_mha"]}  # the server's flag wins over the method's
    with pytest.raises(cfg.ConfigError, match="topk 4 on trtllm_mha"):
        validated(config)
    config["methods"] = [{"name": "n", "algorithm": "ngram"}]
    config["server"] = {"flags": ["--page-size", "16", "--attention-backend", "flashinfer"]}
    (method,) = expand_methods(validated(config))
    assert method.attention_backend == "flashinfer"  # recorded as it runs
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 64}]
    config["server"] = {"flags": ["--attention-backend", "fa3"]}
    with pytest.raises(cfg.ConfigError, match="DDTree budget 64 builds a tree"):
        validated(config)
    # NGRAM at breadth 1 on pages: SGLang's rule needs a tree of breadth above 1 to refuse it
    config["methods"] = [
        {
            "name": "n",
            "algorithm": "ngram",
            "max_bfs_breadth": 1,
            "flags": ["--page-size", "16"],
            "attention_backend": "fa3",
        }
    ]
    config["server"] = {}
    assert expand_methods(validated(config))[0].params["max_bfs_breadth"] == 1


def test_a_parameter_the_spelling_never_passes_is_refused_or_left_to_the_server():
    config = load_default_config()
    config["algorithms"] = {
        "ngram": {"flags": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "{num_draft_tokens}"]}
    }
    config["methods"] = [{"name": "n", "algorithm": "ngram", "max_bfs_breadth": 4}]
    with pytest.raises(cfg.ConfigError, match=r"\(n\): 'max_bfs_breadth' is set, but the spelling .* passes no"):
        validated(config)
    config["methods"] = [{"name": "n", "algorithm": "ngram"}]  # not set: the server's own default, recorded
    assert expand_methods(validated(config))[0].params["max_bfs_breadth"] == 10
    # DDTree without SGLANG_DDTREE_MAX_TOPK in its spelling runs the build's own cap, and says so
    config["algorithms"] = {"ddtree": {"env": {}}}
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 64}]
    (method,) = expand_methods(validated(config))
    assert method.params["topk"] is None and algorithms.DDTREE.shape(method.params) == ("tree", 5)


def test_the_simulated_backend_refuses_drafters_it_would_simulate_alike():
    config = load_default_config()
    config["methods"] = [dict(EAGLE3_TREE), dict(EAGLE3_TREE, name="e3b", drafter="heads/another")]
    with pytest.raises(cfg.ConfigError, match="eagle3 methods name 2 drafters .* simulate them alike"):
        validated(config)
    config["backend"], config["model"]["path"] = "sglang", "m"  # a real server runs each head it is given
    assert len(expand_methods(validated(config))) == 2


def test_sweeps_of_any_parameter_name_each_method_by_its_tags():
    methods = expand_methods(
        configured(
            {"name": "ng", "algorithm": "ngram", "num_draft_tokens": [8, 16, 64]},
            {"name": "e3", "algorithm": "eagle3", "drafter": "h", "num_steps": [3, 5]},
            {
                "name": "tr",
                "algorithm": "eagle3",
                "drafter": "h",
                "topk": [2, 4],
                "num_steps": 3,
                "num_draft_tokens": 8,
            },
        )
    )
    by_name = {m.name: m for m in methods}
    assert list(by_name) == ["ng-d8", "ng-d16", "ng-d64", "e3-s3", "e3-s5", "tr-t2", "tr-t4"]
    assert by_name["ng-d16"].params == {"num_draft_tokens": 16, "max_bfs_breadth": 10, "match_type": "BFS"}
    flags = by_name["ng-d64"].flags
    assert (
        flags[flags.index("--speculative-num-draft-tokens") + 1] == "64"
        and "--speculative-draft-model-path" not in flags
    )
    # a chain's draft tokens follow its steps; each method keeps its own drafter
    assert by_name["e3-s5"].params == {"num_steps": 5, "topk": 1, "num_draft_tokens": 6}
    assert by_name["e3-s5"].drafter == "h" and by_name["e3-s5"].as_dict()["drafter"] == "h"
    assert by_name["tr-t4"].flags[by_name["tr-t4"].flags.index("--speculative-eagle-topk") + 1] == "4"
    # the shapes and widths the plan, the simulator and the report read
    shapes = {
        name: (algorithms.get(m.algorithm).shape(m.params), algorithms.get(m.algorithm).verify_width(m.params))
        for name, m in by_name.items()
    }
    # forced acceptance sweeps too: SGLang's variable set per method, left unset (the drafter's own) without it
    forced = expand_methods(configured({"name": "f", "algorithm": "eagle3", "drafter": "h", "accept_length": [2, 3.5]}))
    assert [(m.name, m.env) for m in forced] == [
        ("f-a2", {"SGLANG_SIMULATE_ACC_LEN": "2.0"}),
        ("f-a3.5", {"SGLANG_SIMULATE_ACC_LEN": "3.5"}),
    ]
    assert by_name["e3-s5"].env == {} and "accept_length" not in by_name["e3-s5"].params
    with pytest.raises(
        cfg.ConfigError,
        match=r"methods\[0\] \(f\)\.accept_length: accept_length 5 is outside 1 \.\. num_steps \+ 1 = 4",
    ):
        expand_methods(configured({"name": "f", "algorithm": "eagle", "drafter": "h", "accept_length": 5}))
    assert shapes == {
        "ng-d8": (("tree", 10), 8),
        "ng-d16": (("tree", 10), 16),
        "ng-d64": (("tree", 10), 64),
        "e3-s3": (("chain", 1), 4),
        "e3-s5": (("chain", 1), 6),
        "tr-t2": (("tree", 2), 8),
        "tr-t4": (("tree", 4), 8),
    }


def test_defaults_are_per_algorithm_and_the_flat_keys_keep_their_old_meaning():
    methods = expand_methods(
        configured(
            {"name": "t", "algorithm": "ddtree", "budget": 32},
            {"name": "e", "algorithm": "eagle", "drafter": "h"},
            defaults={"topk": 2, "eagle": {"num_steps": 5}},
        )
    )
    assert methods[0].params["topk"] == 2 and methods[0].env == {"SGLANG_DDTREE_MAX_TOPK": "2"}
    # the flat topk is DDTree's width cap, not EAGLE's beam: the EAGLE method stays a chain
    assert methods[1].params == {"num_steps": 5, "topk": 1, "num_draft_tokens": 6}


def test_like_for_like_scheduling_takes_the_overlap_scheduler_from_every_speculative_method_that_has_it():
    methods = expand_methods(
        configured(
            {"name": "ar", "algorithm": "ar"},
            {"name": "n", "algorithm": "ngram"},
            dict(EAGLE3_TREE),
            {"name": "t", "algorithm": "ddtree", "budget": 8},
            match_ddtree_scheduling=True,
        )
    )
    off = {m.name: "--disable-overlap-schedule" in m.flags for m in methods}
    assert off == {"ar": False, "n": True, "e3": True, "t": False}  # DDTree runs without it anyway


def test_every_algorithm_launches_with_flags_sglang_0_5_16_parses_and_the_simulator_reads_back():
    """The argv a real server gets parses with the recorded 0.5.16 option table, and the simulated server started
    with exactly that argv decodes with the method's own parameters."""
    config = load_default_config()
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "df", "algorithm": "dflash"},
        {"name": "t", "algorithm": "ddtree", "budget": 32, "topk": 4},
        {"name": "n", "algorithm": "ngram", "num_draft_tokens": 24, "max_bfs_breadth": 3, "match_type": "PROB"},
        dict(EAGLE3_TREE),
        {"name": "e1", "algorithm": "eagle", "drafter": "h", "num_steps": 2},
        {"name": "s", "algorithm": "standalone", "drafter": "small"},
        {"name": "f", "algorithm": "eagle", "drafter": "h", "accept_length": 2.5},
    ]
    config["model"]["load_format"] = "dummy"
    config["sglang"] = {
        "options_table": "0.5.16",
        "extra_flags": [{"flag": "--speculative-ddtree-budget", "type": "int"}],
    }
    config = validated(config)
    for method in expand_methods(config):
        job = server_job(config, 1, method.name)
        args = server_arguments(job, 30000, 16384)
        check_argv(args, "0.5.16", config["sglang"]["extra_flags"])
        spec = algorithms.get(method.algorithm)
        assert ("--speculative-draft-load-format" in args) == bool(spec.drafter)  # dummy weights only for drafters
        argv, env = launch_command(job, 30000, 16384)
        decoding = decoding_from_args(parse_args(argv[3:]), env)
        assert decoding.algorithm == method.algorithm
        assert decoding.params() == method.params, method.name
        assert decoding.verify_width() == spec.verify_width(method.params)


def test_a_spelling_may_offer_alternatives_chosen_from_the_build():
    assert choose_flags(["--new-flag|--old-flag", "3", "--x"], {"--old-flag", "--x"}) == ["--old-flag", "3", "--x"]
    assert choose_flags(["--new-flag|--old-flag", "3"], {"--new-flag", "--old-flag"}) == ["--new-flag", "3"]
    # offered by neither: the first, so that the check against the build names it
    assert choose_flags(["--new-flag|--old-flag"], set()) == ["--new-flag"]
    config = load_default_config()
    config["algorithms"] = {
        "dflash": {
            "flags": [
                "--speculative-algorithm",
                "DFLASH",
                "--speculative-draft-model-path",
                "{drafter}",
                "--speculative-dflash-block-size|--speculative-num-draft-tokens",
                "{block_size}",
            ]
        }
    }
    config["methods"] = [{"name": "df", "algorithm": "dflash"}]
    config = validated(config)
    job = server_job(config, 1, "df")
    old = server_arguments(job, 1, 4096, offered={"--speculative-num-draft-tokens", "--enable-metrics"})
    assert old[old.index("--speculative-num-draft-tokens") + 1] == "16" and "--speculative-dflash-block-size" not in old


def test_plan_full_compares_the_seed_methods_with_eagle3_and_ngram_baselines():
    config = validated(yaml.safe_load((REPO / "config" / "plan-full.yaml").read_text()))
    methods = expand_methods(config)
    algorithms_in = {m.algorithm for m in methods}
    assert {"ar", "dflash", "ddtree", "eagle3", "ngram"} <= algorithms_in
    shapes = {algorithms.get(m.algorithm).shape(m.params) for m in methods if m.algorithm == "eagle3"}
    assert ("chain", 1) in shapes and any(s[0] == "tree" for s in shapes)


MINE = {"source": "a fork", "spine_mode": False, "width": "topk", "max_topk": 16, "depth_bonus": 0.0}


def _with_build(fields: dict, **method) -> dict:
    config = load_default_config()
    config["ddtree_builds"] = {"mine": {"early_stop_margin": None, **fields}}
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {"name": "ddtree", "algorithm": "ddtree", "budget": 16, "tree_build": "mine", **method},
    ]
    return config


def test_a_build_defined_in_configuration_runs_in_the_plan_and_on_the_simulated_server(tmp_path):
    """ddtree_builds: a build of the configuration's own, with "uncapped" top-k (the build's own cap)."""
    config = validated(_with_build(MINE, topk=[8, "uncapped"]))
    methods = {m.name: m for m in expand_methods(config)}
    assert set(methods) == {"ar", "ddtree-t8", "ddtree-tuncapped"}
    assert methods["ddtree-t8"].env == {"SGLANG_DDTREE_MAX_TOPK": "8"} and methods["ddtree-tuncapped"].env == {}
    assert "topk" not in methods["ddtree-tuncapped"].params
    assert algorithms.method_shape(methods["ddtree-tuncapped"].as_dict())[1:] == ("tree", 16)  # its max_topk
    assert algorithms.method_shape(methods["ddtree-t8"].as_dict())[1:] == ("tree", 8)
    job = server_job(config, 1, "ddtree-tuncapped")
    argv, env = launch_command(job, 30000, 8192, sys.executable)
    args = parse_args(argv[3:])  # the simulated server reads the build from its command line
    assert decoding_from_args(args, env).tree_shape() == ("tree", 16)
    # on the simulated backend the build's fields are in the DDTree cells' key, never AR's
    edited = validated(_with_build({**MINE, "depth_bonus": 0.5}, topk=[8, "uncapped"]))
    assert server_job(edited, 1, "ddtree-tuncapped").sim != job.sim
    assert server_job(edited, 1, "ar").sim == server_job(config, 1, "ar").sim


@pytest.mark.parametrize(
    "fields, method, message",
    [
        (MINE, {"topk": "uncapped", "tree_build": "nobody"}, "unknown DDTree build 'nobody'.*mine, paper"),
        ({**MINE, "max_topk": 40}, {}, "max_topk"),
        ({**MINE, "width": "wide"}, {}, "width"),
        ({**MINE, "depth": 3}, {}, "depth"),
    ],
)
def test_a_defined_build_is_checked_and_named_in_the_error(fields, method, message):
    with pytest.raises(Exception, match=message):
        expand_methods(validated(_with_build(fields, **method)))


def test_a_shipped_builds_name_and_uncapped_outside_ddtree_are_refused():
    config = load_default_config()
    config["ddtree_builds"] = {"paper": {**MINE, "early_stop_margin": None}}
    with pytest.raises(cfg.ConfigError, match="ddtree_builds.paper: a shipped build has this name"):
        expand_methods(validated(config))
    config = load_default_config()
    config["methods"] = [{"name": "e", "algorithm": "eagle3", "drafter": "d", "topk": "uncapped"}]
    with pytest.raises(cfg.ConfigError, match=r"methods\[0\] \(e\).topk: 'uncapped' is DDTree's"):
        expand_methods(validated(config))


def test_plan_seed_is_the_seeds_plan_and_runs_on_the_simulated_backend():
    """config/plan-seed.yaml: the seed's eight RTX PRO 6000s, hybrid 27B, private build (its own tree rules, its
    flags declared), AR, DFlash and DDTree budgets with 15 at top-k 8 and 16 uncapped, TP 1/4/8, five families and
    the concurrency sweep; with backend sim every server's command line carries the build and its flags."""
    raw = yaml.safe_load((REPO / "config" / "plan-seed.yaml").read_text())
    config = validated({**raw, "backend": "sim"})
    methods = {m.name: m for m in expand_methods(config)}
    assert {"ar", "dflash", "ddtree-b15", "ddtree-uncapped"} <= set(methods)
    assert methods["ddtree-b15"].env == {"SGLANG_DDTREE_MAX_TOPK": "8"} and methods["ddtree-uncapped"].env == {}
    assert algorithms.method_shape(methods["ddtree-b15"].as_dict())[1:] == ("tree", 8)
    assert algorithms.method_shape(methods["ddtree-uncapped"].as_dict())[1:] == ("tree", 32)
    assert config["tp"] == [1, 4, 8] and config["gpu_pool"]["devices"] == 8
    assert {w["family"] for w in config["workloads"]} == {"short", "long", "very_long", "agentic_1", "agentic_2"}
    assert config["sim"]["gpu"] == "RTX-PRO-6000" and config["sim"]["model_profile"] == "hybrid-27b"
    job = server_job(config, 4, "ddtree-uncapped")
    argv, env = launch_command(job, 30000, 8192, sys.executable)
    assert "--speculative-ddtree-allow-hybrid-unsafe" in argv
    args = parse_args(argv[3:])
    assert decoding_from_args(args, env).tree_shape() == ("tree", 32) and args.tp_size == 4
    assert args.sim_unmodelled_flags == ["--speculative-ddtree-allow-hybrid-unsafe"]
