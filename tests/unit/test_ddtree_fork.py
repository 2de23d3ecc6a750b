"""A DDTree fork as a build of its own: its rules and refusals known before any job, its configuration
(config/gpu-ddtree.yaml), and its stage profiler's records read into cells, measured or simulated."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from conftest import REPO, load_default_config, validated
from specsweep import config as cfg
from specsweep import ddtree, ddtree_profile, sglang_options
from specsweep.jobs import all_cells
from specsweep.methods import expand_methods
from specsweep.modelling.cost import CostModel
from specsweep.modelling.decoding import Decoding

FORK = "rancy-wang-ddtree-v2"
FORK_SPELLING = {
    "flags": [
        "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
        "--speculative-ddtree-block-size", "{block_size}", "--speculative-ddtree-budget", "{budget}",
        "--page-size", "1",
    ],
    "env": {},
    "attention_backend": "triton",
}  # fmt: skip


def fork_config(method: dict, spelling: dict | None = FORK_SPELLING) -> dict:
    config = load_default_config()
    fork_engine = yaml.safe_load((REPO / "config" / "gpu-ddtree.yaml").read_text())["engines"][1]
    config["sglang"] = {**config.get("sglang", {}), "options_table": fork_engine["sglang"]["options_table"]}
    if spelling is not None:
        config["algorithms"] = {"ddtree": spelling}
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "tree_build": FORK, "attention_backend": "triton",
                          **method}]  # fmt: skip
    return config


# ------------------------------------------------------------------ the build's rules


def test_the_fork_verifies_a_tree_as_wide_as_its_budget_at_every_budget():
    build = ddtree.build(FORK)
    for budget in (8, 15, 16, 22, 32, 64):
        assert ddtree.shape(build, 16, budget, None) == ("tree", budget)  # no spine mode, no cap
    # PR 29907 verifies a chain up to block_size - 1 and caps its width
    assert ddtree.shape(ddtree.build("sglang-pr29907"), 16, 15, None) == ("chain", 1)
    assert ddtree.shape(ddtree.build("sglang-pr29907"), 16, 64, None) == ("tree", 5)


def test_the_forks_best_first_tree_takes_exactly_its_budget_of_nodes_over_ranked_candidates():
    build = ddtree.build(FORK)
    log_probs = tuple(tuple(-0.1 - 0.7 * r - 0.05 * d for r in range(ddtree.MAX_CANDIDATES)) for d in range(15))
    for budget in (8, 15, 16, 64):
        tree = ddtree.tree_prefixes(build, log_probs, budget, budget, "tree")
        assert len(tree) == budget
        assert all(p[:-1] in tree for p in tree if len(p) > 1)  # every node's parent is in the tree


def test_the_overlap_scheduler_runs_as_the_build_runs_it():
    fork = Decoding.of_params("ddtree", {"budget": 16, "block_size": 16, "tree_build": FORK}, True, {})
    pr = Decoding.of_params("ddtree", {"budget": 16, "block_size": 16, "tree_build": "sglang-pr29907"}, True, {})
    assert fork.overlap and not pr.overlap
    switched_off = Decoding.of_params("ddtree", {"budget": 16, "tree_build": FORK}, False, {})
    assert not switched_off.overlap


# ------------------------------------------------------------------ refused before any job


def test_the_forks_recorded_option_table_has_its_ddtree_options_and_lacks_what_it_dropped():
    """The table recorded from the installed build (device.sh ddtree-options): its DDTree flags parse, typed as the
    build declares them; 0.5.16's options the build does not have are refused by name."""
    table = yaml.safe_load((REPO / "config" / "gpu-ddtree.yaml").read_text())["engines"][1]["sglang"]["options_table"]
    argv = ["--model-path", "m", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "16",
            "--speculative-ddtree-block-size", "16", "--speculative-ddtree-cuda-graph-buckets", "8", "17",
            "--is-ddtree-prune", "--use-tree-attention", "--speculative-ddtree-profile",
            "--speculative-ddtree-profile-interval", "10", "--speculative-ddtree-profile-output", "p"]  # fmt: skip
    sglang_options.check_argv(argv, table)
    with pytest.raises(sglang_options.FlagError, match="--speculative-ddtree-budget"):
        sglang_options.check_argv(["--model-path", "m", "--speculative-ddtree-budget", "x"], table)
    with pytest.raises(sglang_options.FlagError, match=r"--sidecar is not an option of SGLang ddtree-v2-433c58e"):
        sglang_options.check_argv(["--model-path", "m", "--sidecar"], table)
    sglang_options.check_argv(["--model-path", "m", "--sidecar", "s"], "0.5.16")  # 0.5.16 has it


def test_a_width_cap_on_the_fork_is_refused_naming_the_build():
    with pytest.raises(cfg.ConfigError, match=r"topk 8: the DDTree build 'rancy-wang-ddtree-v2' has no width cap"):
        expand_methods(validated(fork_config({"budget": 16, "topk": 8}, spelling=None)))
    # with the fork's own spelling (no {topk}), a cap is a parameter the server never sees
    with pytest.raises(cfg.ConfigError, match=r"'topk' is set, but the spelling"):
        expand_methods(validated(fork_config({"budget": 16, "topk": 4})))
    method = expand_methods(validated(fork_config({"budget": 16})))[0]
    assert method.params["topk"] is None and method.env == {}


def test_a_budget_below_the_drafters_depth_on_the_fork_is_refused_naming_the_key():
    """The fork follows the accepted path as block_size - 1 tokens: budget 8 at block 16 crashed its first verify
    on the H200; it is refused before any job, naming the budget and what to do; 15 at block 16 and 8 at block 9
    are taken."""
    with pytest.raises(
        cfg.ConfigError,
        match=r"budget 8: .*'rancy-wang-ddtree-v2' needs a budget of at least "
        r"block_size - 1 = 15.*use budgets from 15, or a drafter of a smaller block_size",
    ):
        expand_methods(validated(fork_config({"budget": 8, "block_size": 16})))
    for params in ({"budget": 15, "block_size": 16}, {"budget": 8, "block_size": 9}):
        assert expand_methods(validated(fork_config(params)))[0].params["budget"] == params["budget"]


def test_a_configured_build_may_need_a_full_depth_budget():
    """full_depth_budget on a build of the configuration's own (ddtree_builds) is taken and refuses a budget below
    block_size - 1; a value that is not true or false is refused naming the field."""
    config = fork_config({"budget": 8, "block_size": 16, "tree_build": "mine"}, spelling=None)
    own = dict(yaml.safe_load((REPO / "specsweep" / "data" / "ddtree_builds.yaml").read_text())[FORK])
    config["ddtree_builds"] = {"mine": {**own, "costs": {}}}
    with pytest.raises(cfg.ConfigError, match=r"budget 8: the DDTree build 'mine' needs a budget of at least"):
        expand_methods(validated(config))
    config["ddtree_builds"]["mine"]["full_depth_budget"] = "yes"
    with pytest.raises(Exception, match=r"full_depth_budget"):  # the schema's check, before the build's own
        expand_methods(validated(config))
    with pytest.raises(ValueError, match=r"mine.full_depth_budget: true or false, not 'yes'"):
        ddtree.tree_build("mine", config["ddtree_builds"]["mine"], "ddtree_builds")


def test_a_page_size_or_attention_backend_the_forks_tree_verify_does_not_take_is_refused():
    paged = dict(FORK_SPELLING, flags=FORK_SPELLING["flags"][:-2])  # a spelling that leaves the page size alone
    with pytest.raises(cfg.ConfigError, match=r"--page-size 16: .*rancy-wang-ddtree-v2.* only with --page-size 1"):
        expand_methods(validated(fork_config({"budget": 16, "flags": ["--page-size", "16"]}, paged)))
    assert expand_methods(validated(fork_config({"budget": 16}, paged)))  # SGLang's default page size, 1
    spelling = dict(FORK_SPELLING, attention_backend=None)
    with pytest.raises(cfg.ConfigError, match=r"attention backend 'trtllm_mha'.*only on triton, flashinfer, fa3"):
        expand_methods(validated(fork_config({"budget": 15, "attention_backend": "trtllm_mha"}, spelling)))


def test_a_ddtree_variable_the_build_does_not_read_is_refused():
    with pytest.raises(cfg.ConfigError, match=r"SGLANG_DDTREE_MAX_TOPK: the DDTree build 'rancy-wang-ddtree-v2' reads"):
        expand_methods(validated(fork_config({"budget": 16, "env": {"SGLANG_DDTREE_MAX_TOPK": "8"}})))
    # PR 29907 reads it
    config = load_default_config()
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 16, "env": {"SGLANG_DDTREE_RANK_PROBE": "1"}}]
    assert expand_methods(validated(config))[0].env["SGLANG_DDTREE_RANK_PROBE"] == "1"


def test_a_build_declaring_variables_of_another_kind_is_refused():
    fields = {**yaml.safe_load((REPO / "specsweep/data/ddtree_builds.yaml").read_text())[FORK], "variables": ["PATH"]}
    with pytest.raises(ValueError, match=r"ddtree_builds.mine.variables: 'PATH' is not a variable of SGLang's kind"):
        ddtree.tree_build("mine", fields, "ddtree_builds")


def test_gpu_ddtree_config_runs_ar_and_dflash_on_both_engines_and_ddtree_on_the_fork():
    config = validated(cfg.read_config_file(REPO / "config" / "gpu-ddtree.yaml"))
    names = [m.name for m in expand_methods(config)]
    assert sorted(names) == sorted(
        [f"{m}@{e}" for m in ("ar", "dflash") for e in ("sglang-0.5.16", "ddtree-v2")]
        + [f"ddtree-b{b}@ddtree-v2" for b in (15, 16, 22, 32, 64)]
        + [f"ddtree-plain-b{b}@ddtree-v2" for b in (15, 16)]
    )
    methods = {m.name: m for m in expand_methods(config)}
    ddtree_b16 = methods["ddtree-b16@ddtree-v2"]
    assert ddtree_profile.output_path(list(ddtree_b16.flags)) == "results/ddtree-profile/b16.jsonl"
    assert ddtree_b16.env == {} and ddtree_b16.params["tree_build"] == FORK
    assert ddtree_profile.output_path(list(methods["ddtree-plain-b16@ddtree-v2"].flags)) is None  # its control
    assert len(all_cells(config)) == 88  # 11 servers of 8 cells


def test_a_simulated_cell_of_a_build_with_its_own_costs_is_keyed_by_them(monkeypatch):
    """The build's fitted round costs price its simulated rounds, so they are in its simulated cells' keys: a refit
    measures them again; a real server's cells and another build's keep their keys."""
    from conftest import fast_config

    from specsweep import jobs
    from specsweep.cells import keyed_cells

    fork = fork_config({"budget": 15})
    config = {**fast_config(), "sglang": fork["sglang"], "algorithms": fork["algorithms"]}
    config["methods"] = [
        {"name": "ar", "algorithm": "ar"},
        {**fork["methods"][0], "name": "fork"},
        {**fork["methods"][0], "name": "pr", "tree_build": "sglang-pr29907"},
    ]
    config = validated(config)

    def keys(method):
        return [c["key"] for c in keyed_cells(jobs.server_job(config, 1, method), "identity")[0]]

    before = {m: keys(m) for m in ("fork", "pr", "ar")}
    shipped = ddtree.shipped_builds()
    refit = dataclasses.replace(shipped[FORK], costs=(("tree_round_fixed", 0.0006),))
    monkeypatch.setattr(ddtree, "shipped_builds", lambda: {**shipped, FORK: refit})
    assert set(keys("fork")).isdisjoint(before["fork"])
    assert keys("pr") == before["pr"] and keys("ar") == before["ar"]


# ------------------------------------------------------------------ the stage profiler's records


def record(stages: dict, rounds: int = 10, **meta) -> dict:
    return {
        "type": ddtree_profile.RECORD_TYPE, "name": "ddtree_v2", "rank": 0, "round_start": 0, "round_end": rounds,
        "profiled_rounds": rounds, "warmup": 0, "interval": rounds,
        "meta": {k: {"count": rounds, "sum": v * rounds, "avg": v} for k, v in meta.items()},
        "stages": stages,
    }  # fmt: skip


def gpu(ms_per_round: float, rounds: int = 10) -> dict:
    total = ms_per_round * rounds
    host = {"cpu_count": rounds, "cpu_sum_ms": 0.01 * rounds, "cpu_avg_ms": 0.01, "cpu_max_ms": 0.02}
    return {**host, "gpu_count": rounds, "gpu_sum_ms": total, "gpu_avg_ms": ms_per_round, "gpu_max_ms": ms_per_round}


def test_split_reads_gpu_time_per_round_into_parts_and_keeps_unknown_stages_by_name():
    records = [
        record(
            {
                "draft_forward": gpu(2.0),
                "draft_head_topk": gpu(0.5),
                "tree_gpu_build": gpu(0.25),
                "mask_compile": gpu(0.25),
                "target_verify": gpu(10.0),
                "accept_follow": gpu(1.0),
                "kv_compact": gpu(0.75),
            },
            verify_width=16.0,
            batch_size=4.0,
        ),  # fmt: skip
        record({"draft_forward": gpu(4.0, 30), "target_verify": gpu(14.0, 30)}, rounds=30, verify_width=16.0),
    ]
    found = ddtree_profile.split(records)
    assert found["rounds"] == 40 and found["records"] == 2
    per_round = found["seconds_per_round"]
    assert per_round["draft"] == pytest.approx((2.5 * 10 + 4.0 * 30) / 1000 / 40)
    assert per_round["tree_build"] == pytest.approx(0.5 * 10 / 1000 / 40)
    assert per_round["verify"] == pytest.approx((10.0 * 10 + 14.0 * 30) / 1000 / 40)
    assert per_round["follow"] == pytest.approx(1.0 * 10 / 1000 / 40)
    assert found["unknown"] == ["kv_compact"]
    assert per_round["other"] == pytest.approx(found["stages"]["kv_compact"]) == pytest.approx(0.75 * 10 / 1000 / 40)
    assert sum(per_round.values()) == pytest.approx(sum(found["stages"].values()))
    assert found["meta"]["verify_width"] == pytest.approx(16.0) and found["meta"]["batch_size"] == pytest.approx(4.0)


def test_a_host_side_stage_is_read_on_the_cpu_clock():
    cpu_only = {"cpu_count": 10, "cpu_sum_ms": 30.0, "cpu_avg_ms": 3.0, "cpu_max_ms": 4.0}
    found = ddtree_profile.split([record({"tree_heap_cpu": cpu_only, "target_verify": gpu(10.0)})])
    assert found["seconds_per_round"]["tree_build"] == pytest.approx(0.003)
    assert found["clock"] == {"target_verify": "gpu", "tree_heap_cpu": "cpu"}
    assert ddtree_profile.split([record({"target_verify": gpu(1.0)}, rounds=0)]) is None


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"type": "sglang_speculative_tree_profile", "stages": {', "line 2: not JSON"),
        ('[1, 2]', "line 2: not a JSON object"),
        ('{"type": "other", "profiled_rounds": 1, "stages": {}}', "line 2: type 'other'"),
        ('{"type": "sglang_speculative_tree_profile", "profiled_rounds": -1, "stages": {}}', "profiled_rounds -1"),
        ('{"type": "sglang_speculative_tree_profile", "profiled_rounds": 5}', "no 'stages' object"),
        ('{"type": "sglang_speculative_tree_profile", "profiled_rounds": 5, "stages": {"x": {"gpu_count": 5}}}',
         "stage 'x' has neither gpu_sum_ms nor cpu_sum_ms"),
        ('{"type": "sglang_speculative_tree_profile", "profiled_rounds": 5, "stages": {"x": {"gpu_sum_ms": "1"}}}',
         "stage 'x': gpu_sum_ms '1' is not a duration"),
    ],
)  # fmt: skip
def test_a_malformed_line_is_refused_naming_file_and_line(tmp_path, line, problem):
    path = tmp_path / "b16.jsonl"
    path.write_text(json.dumps(record({"target_verify": gpu(1.0)})) + "\n" + line + "\n")
    with pytest.raises(ddtree_profile.ProfileError) as info:
        ddtree_profile.read_file(path)
    assert str(info.value).startswith(f"{path}, line 2:") and problem in str(info.value)


def test_a_cell_takes_only_the_complete_records_appended_during_its_load(tmp_path):
    path = tmp_path / "profile" / "b16.jsonl"
    assert ddtree_profile.cell_stages(ddtree_profile.ProfileTail(path)) is None  # no file yet: no stages
    path.parent.mkdir()
    path.write_text(json.dumps(record({"target_verify": gpu(50.0)})) + "\n")  # an earlier cell's
    tail = ddtree_profile.ProfileTail(path)
    with open(path, "a") as out:
        out.write(json.dumps(record({"target_verify": gpu(10.0)})) + "\n")
        out.write('{"type": "sglang_speculative_tree_profile", "prof')  # still being written
    found = ddtree_profile.cell_stages(tail)
    assert found["rounds"] == 10 and found["seconds_per_round"]["verify"] == pytest.approx(0.010)
    assert found["file"] == "b16.jsonl"
    with open(path, "a") as out:
        out.write("not json\n")
    with pytest.raises(ddtree_profile.ProfileError, match=r"b16.jsonl, line 3: not JSON"):
        tail.since()


def test_the_profile_file_is_the_one_the_command_line_names_with_the_profiler_on():
    argv = ["--speculative-ddtree-profile", "--speculative-ddtree-profile-output", "a.jsonl"]
    assert ddtree_profile.output_path(argv) == "a.jsonl"
    assert ddtree_profile.output_path(["--speculative-ddtree-profile", "--speculative-ddtree-profile-output=b"]) == "b"
    assert ddtree_profile.output_path(argv[1:]) is None  # the profiler off: nothing written


# ------------------------------------------------------------------ the simulator's split


def cost_model() -> CostModel:
    return CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")


@pytest.mark.parametrize("build", [FORK, "sglang-pr29907"])
def test_the_simulated_split_sums_to_the_modelled_round(build):
    cost = cost_model()
    for budget in (8, 15, 16, 64):
        decoding = Decoding.of_params("ddtree", {"budget": budget, "block_size": 16, "tree_build": build}, True, {})
        for contexts in ([1024], [1024] * 16, [3000, 200, 50, 8000] * 16):
            parts = ddtree_profile.simulated_split(cost, decoding, contexts)
            assert set(parts) == set(ddtree_profile.PARTS) and min(parts.values()) >= 0
            assert sum(parts.values()) == pytest.approx(cost.decode_step(decoding, contexts))
            assert parts["verify"] > parts["follow"] and parts["draft"] > 0
            assert (parts["tree_build"] > 0) == decoding.builds_tree()


def test_a_wider_tree_costs_more_to_build_and_to_verify_in_the_simulated_split():
    cost = cost_model()

    def parts(budget):
        decoding = Decoding.of_params("ddtree", {"budget": budget, "block_size": 16, "tree_build": FORK}, True, {})
        return ddtree_profile.simulated_split(cost, decoding, [1024] * 16)

    narrow, wide = parts(15), parts(64)
    assert wide["tree_build"] > narrow["tree_build"] and wide["verify"] > narrow["verify"]
    assert wide["draft"] == pytest.approx(narrow["draft"])  # one drafter pass whatever the budget


def test_the_simulated_profiler_writes_records_the_reader_reads_back(tmp_path):
    path = tmp_path / "sim.jsonl"
    profiler = ddtree_profile.SimulatedProfiler(path, interval=4)
    split = {"draft": 0.002, "tree_build": 0.0005, "verify": 0.011, "follow": 0.001, "other": 0.0003}
    for _ in range(10):  # two records of 4 rounds; the last 2 rounds are never flushed, as the build's at a stop
        profiler.record_round(split, batch_size=4, verify_width=17)
    records = ddtree_profile.read_file(path)
    assert len(records) == 2 and all(r["simulated"] for r in records)
    found = ddtree_profile.split(records)
    assert found["rounds"] == 8 and found["simulated"]
    for part, seconds in split.items():
        assert found["seconds_per_round"][part] == pytest.approx(seconds)
    assert found["unknown"] == ["simulated_other"] and found["meta"]["verify_width"] == pytest.approx(17)


def test_the_installed_package_must_read_the_variables_its_build_declares():
    from specsweep.environment import ServerEnvironmentError, check_methods

    method = expand_methods(validated(fork_config({"budget": 16})))[0]

    def installed(found):
        return {
            "backend": "sglang",
            "capabilities": {"algorithms": [], "flags": []},
            "server": {"ddtree_variables": found},
        }

    check_methods([method], installed([]))  # the fork reads none, as its rules say
    check_methods([method], installed(None))  # not searched (the simulated backend, an older record): no check
    with pytest.raises(ServerEnvironmentError, match=r"not the DDTree build 'rancy-wang-ddtree-v2'.*reads "
                       r"SGLANG_DDTREE_MAX_TOPK, which the rules do not declare"):  # fmt: skip
        check_methods([method], installed(["SGLANG_DDTREE_MAX_TOPK"]))
    config = load_default_config()
    config["methods"] = [{"name": "t", "algorithm": "ddtree", "budget": 32}]
    pr = expand_methods(validated(config))[0]
    with pytest.raises(ServerEnvironmentError, match=r"it reads no SGLANG_DDTREE_DEPTH_BONUS, SGLANG_DDTREE_RANK"):
        check_methods([pr], installed(["SGLANG_DDTREE_MAX_TOPK"]))


def test_the_stage_table_puts_each_cells_records_beside_the_cost_models_split_of_the_same_round():
    stages = ddtree_profile.split(
        [record({"draft_forward": gpu(2.0), "target_verify": gpu(11.0), "odd": gpu(0.5)}, batch_size=4.0,
                verify_width=17.0, can_run_cuda_graph=1.0)]
    )  # fmt: skip
    requests = [{"error": None, "prompt_tokens": 1000, "output_tokens": 64}] * 3 + [{"error": "timeout"}]
    params = {"budget": 16, "block_size": 16, "tree_build": FORK}
    cell = {
        "simulated": False,
        "cell": {"tp": 1, "method": "ddtree-b16@fork", "workload": "long", "concurrency": 4},
        "method": {"algorithm": "ddtree", "params": params, "engine": "fork"},
        "provenance": {"command": ["python3", "-m", "sglang.launch_server"]},
        "requests": requests,
        "stages": stages,
    }
    plain = {**cell, "cell": {**cell["cell"], "method": "dflash@fork"}, "stages": None}
    settings = {"gpu": "H200", "model_profile": "qwen3-8b", "runtime": "sglang-0.5.16-h200"}
    table = ddtree_profile.stage_rows({"a.json": cell, "b.json": plain}, {"fork|1": settings})
    assert list(table["method"]) == ["ddtree-b16@fork"]  # a cell without records has no row
    row = table.iloc[0]
    assert row["measured_ms_draft"] == pytest.approx(2.0) and row["measured_ms_verify"] == pytest.approx(11.0)
    assert row["measured_ms_other"] == pytest.approx(0.5) and row["unknown"] == "odd"
    assert row["batch"] == 4.0 and row["context"] == pytest.approx(1032) and row["cuda_graph_share"] == 1.0
    decoding = Decoding.of_params("ddtree", params, True, {})
    expected = ddtree_profile.simulated_split(cost_model(), decoding, [1032] * 4)
    for part in ddtree_profile.PARTS:
        assert row[f"modelled_ms_{part}"] == pytest.approx(expected[part] * 1000)
    # no cost model for the engine: the records alone
    alone = ddtree_profile.stage_rows({"a.json": cell}, {})
    assert alone["modelled_ms_round"].isna().all() and alone["measured_ms_round"].iloc[0] == pytest.approx(13.5)


# ---------------------------------------------------------------- the build's own round costs, fitted to its cells


def ddtree_check():
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import ddtree_check as check

    return check


def test_the_forks_simulated_round_is_within_10_percent_of_every_measured_round_and_was_not_before():
    """Every DDTree cell of the build's two H200 records (budgets 15 and 16 unprofiled; 15, 16, 22, 32 and 64
    profiled, their stages scaled to an unprofiled round by the plain/stage share) against the configuration's cost
    model: within 10% with the build's own costs, and without them (the runtime profile's alone) off by more at most
    shapes, the plain ones all under."""
    check = ddtree_check()
    cost = check.cost_model(check.CONFIG)
    found = check.cells(list(check.RECORDS))
    shares = check.stage_share(found)
    rows = [check.compare(cost, cell, shares) for cell in found]
    assert len(rows) == 56 and sum(not r["profiled"] for r in rows) == 16
    assert {r["budget"] for r in rows} == {15, 16, 22, 32, 64} and {r["concurrency"] for r in rows} == {1, 4, 16, 64}
    for r in rows:
        assert abs(r["simulated"] / r["target"] - 1) <= 0.10, (r["workload"], r["concurrency"], r["budget"])
    before = [r["before"] / r["target"] - 1 for r in rows]
    assert sum(abs(e) > 0.10 for e in before) >= 40
    assert max(e for e, r in zip(before, rows) if not r["profiled"]) < -0.05


def test_the_forks_shipped_round_costs_are_what_the_fit_to_its_records_gives():
    """The build's ``costs`` in the data file are ddtree_check.fit's values (derived, not typed), each a runtime
    parameter the cost model states with its mechanism."""
    from specsweep.modelling.cost import RUNTIME_BOUNDS

    check = ddtree_check()
    shipped = ddtree.build(FORK).cost_terms()
    fitted = check.fit(check.cost_model(check.CONFIG), check.cells(list(check.RECORDS)))
    assert set(shipped) == set(fitted) <= set(RUNTIME_BOUNDS)
    for name, value in fitted.items():
        assert shipped[name] == pytest.approx(value, rel=0.01), name
        assert value > 0, name


def test_a_builds_costs_price_its_own_rounds_only():
    """The fork's costs raise its tree rounds (top-k, the tree's verify a node, the exposed round work, each growing
    with the batch) and leave AR, DFlash and pull request 29907's DDTree as the runtime prices them."""
    cost = CostModel.named("H200", "qwen3-8b", "sglang-0.5.16-h200")
    plain = CostModel(cost.gpu, cost.model, cost.runtime, cost.tp, cost.draft_model, build_costs=False)
    for decoding in (Decoding("ar"), Decoding("dflash"), Decoding("ddtree", budget=32)):
        assert cost.decode_step(decoding, [1024] * 16) == plain.decode_step(decoding, [1024] * 16)
    fork = Decoding("ddtree", budget=32, tree_build=FORK)
    extra = [cost.decode_step(fork, [1024] * b) - plain.decode_step(fork, [1024] * b) for b in (1, 16, 64)]
    assert 0 < extra[0] < extra[1] < extra[2]
    terms = ddtree.build(FORK).cost_terms()
    expected = (
        terms["tree_topk_fixed"] + terms["tree_round_fixed"]
        + 64 * (terms["tree_topk_per_request"] + terms["tree_round_per_request"] + 33 * terms["tree_verify_per_node"])
    )  # fmt: skip
    assert extra[2] == pytest.approx(expected)
    split = ddtree_profile.simulated_split(cost, fork, [1024] * 64)
    assert sum(split.values()) == pytest.approx(cost.decode_step(fork, [1024] * 64))


def test_every_shipped_builds_costs_are_runtime_parameters_within_their_bounds():
    from specsweep.modelling.cost import cost_term_problems

    assert ddtree.build(FORK).cost_terms()
    for name, build in ddtree.shipped_builds().items():
        assert cost_term_problems(build.cost_terms()) == [], name


@pytest.mark.parametrize(
    "costs, problem",
    [
        ({"tree_topk_fast": 1e-4}, r"ddtree_builds.mine.costs.tree_topk_fast: not a runtime parameter"),
        ({"tree_round_fixed": 5.0}, r"ddtree_builds.mine.costs.tree_round_fixed: 5.0 is outside"),
        ([1e-4], r"ddtree_builds.mine.costs: a mapping of runtime parameters"),
    ],
)
def test_a_configured_builds_cost_the_cost_model_does_not_know_or_out_of_bounds_is_refused(costs, problem):
    fields = {**yaml.safe_load((REPO / "specsweep/data/ddtree_builds.yaml").read_text())[FORK], "costs": costs}
    config = fork_config({"budget": 15, "topk": "uncapped"})
    config["ddtree_builds"] = {"mine": fields}
    config["methods"][0]["tree_build"] = "mine"
    with pytest.raises(cfg.ConfigError, match=problem):
        expand_methods(config)
