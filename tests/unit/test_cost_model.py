"""Which cost model a configuration uses: a calibration measured on the user's GPUs (`snakemake calibrate`, under
results/calibration/) that matches it, else the configured runtime profile; the plan, the simulated servers and
the labels follow it."""

from __future__ import annotations

import copy
import json
import math
import re

import pytest
import requests
from calibrations import HOST, LABEL, MEASURED_RUNTIME, edit_calibration, environment_of, write_calibration
from conftest import REPO, fast_config, validated
from specsweep import plan
from specsweep.calibration import choose
from specsweep.calibration import fit as fitting
from specsweep.cells import cell_key
from specsweep.errors import CalibrationError, ConfigError
from specsweep.jobs import server_job
from specsweep.launcher import Server, free_port, launch_command
from specsweep.modelling.cost import CostModel, runtime_problems
from specsweep.modelling.decoding import Decoding
from specsweep.modelling.profiles import profiles
from specsweep.sim.args import parse_args
from specsweep.sim.engine import Engine


def sglang_config(**changes) -> dict:
    config = fast_config(time_scale=1)
    config["backend"] = "sglang"
    config.update(changes)
    return validated(config)


def test_a_matching_calibration_prices_the_plans_steps_and_start_ups(tmp_path):
    """On SGLang the plan prices steps with the calibration of this host, model and TP: the same figures as its
    runtime profile given by hand, other than the roofline's; its start-ups are the measured ones."""
    write_calibration(tmp_path / "calibration")
    config = sglang_config()
    calibrated = choose.resolve(config, environment_of(HOST), str(tmp_path / "calibration"))
    by_hand = copy.deepcopy(config)
    by_hand["sim"].update(runtime="mine", profiles={"runtimes": {"mine": MEASURED_RUNTIME}})
    generic, measured, expected = plan.predict(config), plan.predict(calibrated), plan.predict(by_hand)
    assert [r["measure_s"] for r in measured] == pytest.approx([r["measure_s"] for r in expected])
    assert all(m["measure_s"] > 1.2 * g["measure_s"] for m, g in zip(measured, generic))
    firsts = [r for r in measured if r["cold_startup_s"]]
    assert [(r["cold_startup_s"], r["warm_startup_s"]) for r in firsts] == [(153.0, 63.0), (153.0, 63.0)]
    assert {(r["cold_startup_s"], r["warm_startup_s"]) for r in generic if r["cold_startup_s"]} == {
        (plan.startup_seconds(config, 1)[0],) * 2
    }
    assert choose.of(calibrated, 1)["label"] == LABEL
    assert (
        choose.of(config, 1)["label"]
        == "not calibrated: measured runtime sglang-0.5.16-h200 (fitted to SGLang 0.5.16 measured on an H200)"
    )


def test_the_plan_starts_the_first_server_of_each_host_cold_and_later_ones_warm(tmp_path):
    """One GPU: the first server cold, the next warm. Two hosts of one GPU (the calibration's host had one): the
    first server of each host cold, the third warm. plan.md and the predictions say which."""
    write_calibration(tmp_path / "calibration")
    config = sglang_config(methods=[{"name": m, "algorithm": "ar"} for m in ("a", "b", "c")])
    config = choose.resolve(config, environment_of(HOST), str(tmp_path / "calibration"))
    rows = plan.predict(config)
    for gpus, colds in ((1, 1), (2, 2)):
        md, csv = tmp_path / f"plan-{gpus}.md", tmp_path / f"plan-{gpus}.csv"
        result = plan.write_plan(config, None, gpus, str(md), str(csv))
        assert sum(result["cold"].values()) == colds
        first = result["order"][:colds]
        assert all(result["starts"][s] == 0 for s in first) and all(result["cold"][s] for s in first)
        later = result["order"][colds:]
        assert later and all(result["starts"][s] > 0 and not result["cold"][s] for s in later)
        text = md.read_text()
        assert text.count("| cold 153 s |") == colds and text.count("| warm 63 s |") == 3 - colds
        assert "start-up, TP 1: measured: cold 153 s (the first server on each host), warm 63 s" in text
        assert "cost model, TP 1: measured on NVIDIA H200 on 2026-12-01, largest deviation 4.2%" in text
        scheduled, _ = plan.packed(config, rows, gpus)
        startups = {r["server"]: r["startup_s"] for r in scheduled if r["cold_startup_s"]}
        assert sorted(startups.values()) == sorted([153.0] * colds + [63.0] * (3 - colds))
    assert "on hosts of 1" in (tmp_path / "plan-2.md").read_text()


def test_packing_starts_cold_what_starts_before_its_host_is_warm():
    """Two servers starting together on one host both compile (cold); one starting after the first start-up on
    its host ended is warm. The lower bound holds."""
    costs = {
        "a": plan.ServerCost(1, 100.0, 50.0, 80.0),
        "b": plan.ServerCost(1, 90.0, 50.0, 80.0),
        "c": plan.ServerCost(1, 40.0, 50.0, 80.0),
    }
    together = plan.pack(costs, 2)
    assert together["cold"] == {"a": True, "b": True, "c": False}
    assert together["seconds"] == {"a": 150.0, "b": 140.0, "c": 40.0}
    assert together["makespan_s"] == 180.0 and together["lower_bound_s"] <= together["makespan_s"]
    alone = plan.pack(costs, 1)
    assert sum(alone["cold"].values()) == 1 and alone["cold"][alone["order"][0]]
    assert alone["makespan_s"] == pytest.approx(230.0 + 50.0) and alone["lower_bound_s"] <= alone["makespan_s"]
    # without a measured difference (cold = warm) the packing is the one it always was
    flat = {s: plan.ServerCost(c.tp, c.seconds) for s, c in costs.items()}
    assert plan.pack(flat, 2)["makespan_s"] == 130.0


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"model": "Qwen/Qwen3-32B"}, "model Qwen/Qwen3-32B, not Qwen/Qwen3-8B or Qwen3-8B"),
        ({"tp": 2}, "TP 2, not configured (tp: [1])"),
        ({"driver": "550.54"}, "driver 550.54, not this host's 570.86.15"),
        ({"gpu": "NVIDIA B200"}, "gpu NVIDIA B200, not this host's NVIDIA H200"),
        ({"gpu_count": 8}, "gpu_count 8, not this host's 1"),
        ({"engine_version": "0.5.23"}, "engine_version sglang 0.5.23, not this host's sglang 0.5.16"),
        ({"engine_commit": "0" * 40}, f"engine_commit {'0' * 40}, not this host's None"),
    ],
)
def test_a_calibration_of_another_host_model_or_tp_is_ignored_and_the_plan_says_why(tmp_path, change, reason):
    path = write_calibration(tmp_path / "calibration", **change)
    config = choose.resolve(sglang_config(), environment_of(HOST), str(tmp_path / "calibration"))
    assert choose.of(config, 1)["label"].startswith("not calibrated: measured runtime sglang-0.5.16-h200")
    assert config["cost_model"]["ignored"] == [f"{path}: {reason}"]
    assert plan.predict(config) == plan.predict(sglang_config())
    lines = plan.cost_model_lines(config)
    measured = "measured runtime sglang-0.5.16-h200 (fitted to SGLang 0.5.16 measured on an H200)"
    assert f"- cost model, TP 1: not calibrated: {measured}" in lines[0]
    assert lines[-1] == f"- calibrations not used: {path}: {reason}"


def test_without_the_hosts_environment_record_no_calibration_matches_on_sglang(tmp_path):
    write_calibration(tmp_path / "calibration")
    config = choose.resolve(sglang_config(), None, str(tmp_path / "calibration"))
    assert choose.of(config, 1)["calibration"] is None
    assert "environment is not probed yet" in config["cost_model"]["ignored"][0]


def test_the_simulated_server_runs_the_calibrated_profile(tmp_path):
    """On the simulated backend the calibration of the simulated GPU, the model and the TP reaches the server (its
    runtime profile on the command line), changes its steps and the cells' keys; sim.calibration: none keeps the
    roofline."""
    folder = tmp_path / "calibration"
    path = write_calibration(folder)
    config = validated(fast_config())
    calibrated = choose.resolve(config, None, str(folder))
    job, generic_job = server_job(calibrated, 1, "dflash"), server_job(config, 1, "dflash")
    assert job.sim["runtime"] == "calibrated-tp1" and job.sim["profiles"]["runtimes"]["calibrated-tp1"]
    assert job.sim["cost_model"] == {"label": choose.of(calibrated, 1)["label"], "calibration": path.name}
    cell = {"workload": "short", "concurrency": 1, "repetition": 0, "requests": 4}
    assert cell_key(job, cell, "prompts", "env") != cell_key(generic_job, cell, "prompts", "env")

    port = free_port()
    argv, env = launch_command(job, port, 8192)
    engine = Engine(parse_args(argv[3:]))
    decoding, batch = Decoding("dflash", 16), [2000] * 4
    expected = CostModel.named("H200", "qwen3-8b", "mine", 1, {"runtimes": {"mine": MEASURED_RUNTIME}})
    assert engine.cost.decode_step(decoding, batch) == pytest.approx(expected.decode_step(decoding, batch))
    generic = Engine(parse_args(launch_command(generic_job, port, 8192)[0][3:]))
    assert engine.cost.decode_step(decoding, batch) > 1.2 * generic.cost.decode_step(decoding, batch)
    server = Server(argv, env, "127.0.0.1", port, tmp_path / "server.log")
    try:
        server.start(60)
        info = requests.get(f"{server.url}/get_server_info", timeout=10).json()
    finally:
        server.stop()
    assert info["simulated"] and info["sim_runtime"] == "calibrated-tp1"
    assert json.loads(info["sim_profiles"])["runtimes"]["calibrated-tp1"] == MEASURED_RUNTIME

    forced_off = fast_config()
    forced_off["sim"]["calibration"] = "none"
    off = choose.resolve(validated(forced_off), None, str(folder))
    assert server_job(off, 1, "dflash").sim["runtime"] == "sglang-0.5.16-h200"
    assert (
        choose.of(off, 1)["label"]
        == "not calibrated: measured runtime sglang-0.5.16-h200 (fitted to SGLang 0.5.16 measured on an H200)"
    )
    assert plan.predict(off) == plan.predict(config)


def test_the_simulated_backend_matches_the_gpu_by_name_the_model_and_the_tp(tmp_path):
    folder = tmp_path / "calibration"
    other_gpu = write_calibration(folder, "b200.yaml", gpu="NVIDIA B200")
    other_tp = write_calibration(folder, "tp4.yaml", tp=4)
    older = write_calibration(folder, "older.yaml", date="2026-11-20", driver="1")
    newest = write_calibration(folder, "newest.yaml", date="2026-12-02", driver="2")
    config = choose.resolve(validated(fast_config()), None, str(folder))
    assert choose.of(config, 1)["calibration"] == str(newest)  # the host's driver is no matter here
    assert sorted(config["cost_model"]["ignored"]) == sorted(
        [
            f"{other_gpu}: measured on NVIDIA B200, not the simulated H200 (sim.gpu)",
            f"{older}: an older calibration of TP 1 than {newest}",
            f"{other_tp}: TP 4, not configured (tp: [1])",
        ]
    )
    b200 = fast_config()
    b200["sim"]["gpu"] = "B200"
    assert choose.of(choose.resolve(validated(b200), None, str(folder)), 1)["calibration"] == str(other_gpu)


def test_gpu_names_are_matched_to_profiles_by_their_first_words():
    assert choose.normalise_gpu("NVIDIA H100 80GB HBM3") == "H100-80GB-HBM3"
    known = profiles()["gpus"]
    assert choose.gpu_profile("NVIDIA H200", known) == "H200"
    assert choose.gpu_profile("NVIDIA H100 80GB HBM3", known) == "H100"
    assert choose.gpu_profile("NVIDIA RTX PRO 6000 Blackwell Server Edition", known) == "RTX-PRO-6000"
    assert choose.gpu_profile("NVIDIA B200", known) == "B200"
    assert choose.gpu_profile("NVIDIA A100-SXM4-80GB", known) is None
    assert not choose.gpu_matches("H20", "NVIDIA H200") and not choose.gpu_matches("H200", "NVIDIA H20")


def test_sim_calibration_names_one_file_or_a_folder(tmp_path):
    """A file is used for its TP whatever it was measured on; a folder is searched as results/calibration/ is; a
    path that is neither, a broken file or one of a TP not configured is refused naming the key."""
    other_model = write_calibration(tmp_path / "mine", "x.yaml", model="someone/else", gpu="NVIDIA B200")
    config = fast_config()
    config["sim"]["calibration"] = str(other_model)
    forced = choose.resolve(validated(config), None, str(tmp_path / "nothing-here"))
    assert choose.of(forced, 1)["label"] == "measured on NVIDIA B200 on 2026-12-01, largest deviation 4.2%"
    assert server_job(forced, 1, "ar").sim["gpu"] == "B200"  # the GPU it was measured on
    matching = write_calibration(tmp_path / "folder")
    config["sim"]["calibration"] = str(tmp_path / "folder")
    assert choose.of(choose.resolve(validated(config)), 1)["calibration"] == str(matching)
    for value, match in (
        (str(tmp_path / "absent.yaml"), "sim.calibration: '.*absent.yaml' is neither auto, none, nor a calibration"),
        (str(write_calibration(tmp_path / "t", tp=2)), r"sim.calibration: .* was measured at TP 2, which tp \(\[1\]\)"),
    ):
        config["sim"]["calibration"] = value
        with pytest.raises(ConfigError, match=match):
            choose.resolve(validated(config))
    broken = tmp_path / "broken.yaml"
    fingerprint = {"tp": 1, "model": "Qwen/Qwen3-8B"}
    broken.write_text(choose.calibration_text({"fingerprint": fingerprint, "measured_on": {"gpu": "H200", "date": 1}}))
    config["sim"]["calibration"] = str(broken)
    with pytest.raises(ConfigError, match=r"sim.calibration: .*broken.yaml: runtime: missing or not a mapping"):
        choose.resolve(validated(config))


def _cut_short(path):  # a write that stopped halfway (a full disk): its first lines
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: len(lines) // 2]))


def _one_key(path):
    write_calibration(path.parent, path.name, runtime={"bandwidth_efficiency": 0.9})


def _runtime(**changes):
    return lambda path: write_calibration(path.parent, path.name, runtime={**MEASURED_RUNTIME, **changes})


@pytest.mark.parametrize(
    "damage, reason",
    [
        # a value edited by hand (0.025 s -> 2.5 s), the digest left as it was
        (
            lambda path: edit_calibration(path, lambda d: d["runtime"].update(request_latency=2.5)),
            "its content does not match its content_digest (edited or damaged since `snakemake calibrate` wrote it)",
        ),
        (_cut_short, "content_digest: missing (the file was cut short"),
        (lambda path: path.write_text("fingerprint: [1, 2]\n"), "content_digest: missing"),
        # written by calibrate's own code (its digest good), its runtime one the cost model cannot price
        (_one_key, "runtime.compute_efficiency: missing, as are layer_overhead, allreduce_latency, drafter_fraction"),
        (_runtime(bandwidth_efficiency=0), "runtime.bandwidth_efficiency: 0 must be above 0 (the cost model divides"),
        (_runtime(request_latency=1e9), "runtime.request_latency: 1000000000.0 is outside 0..1 seconds a request"),
        (_runtime(request_latency=2.5), "runtime.request_latency: 2.5 is outside 0..1 seconds a request"),
        (_runtime(layer_overhead=float("nan")), "runtime.layer_overhead: nan is not a finite number"),
        (_runtime(layer_overhed=1e-5), "runtime.layer_overhed: not a runtime parameter of the cost model"),
        (_runtime(drafter_per_token="yes"), "runtime.drafter_per_token: 'yes' is not true or false"),
    ],
)
def test_a_broken_calibration_is_named_with_its_key_and_prices_nothing(tmp_path, capsys, damage, reason):
    """A calibration edited, cut short, of one runtime key, with a rate of 0 or a value no engine has: read_calibration
    names the file and the key; found under the folder it prices nothing (its TP size stays on the configured
    runtime) and is listed as broken (what stops a run: tests/workflow/test_calibrate.py); named with sim.calibration
    it is refused."""
    folder = tmp_path / "calibration"
    path = write_calibration(folder, "tp1.yaml", runtime={**MEASURED_RUNTIME, "request_latency": 0.025})
    assert choose.read_calibration(path)["runtime"]["request_latency"] == 0.025
    damage(path)
    with pytest.raises(CalibrationError) as raised:
        choose.read_calibration(path)
    assert str(raised.value).startswith(f"{path}: {reason}") and "`snakemake calibrate` writes it again" in str(
        raised.value
    )
    config = choose.resolve(validated(fast_config()), None, str(folder))
    assert choose.of(config, 1)["calibration"] is None and choose.broken([config]) == [str(raised.value)]
    assert f"warning: calibration ignored: {raised.value}" in capsys.readouterr().err
    assert plan.predict(config) == plan.predict(validated(fast_config()))
    named = fast_config()
    named["sim"]["calibration"] = str(path)
    with pytest.raises(ConfigError, match=re.escape(f"sim.calibration: {path}: {reason}")):
        choose.resolve(validated(named))


def test_every_shipped_runtime_and_committed_calibration_is_within_the_bounds():
    """The bounds hold every runtime the package ships (the measured sglang-0.5.16-h200 too) and the calibration
    committed from the H200 (benchmarks/gpu/calibrate-2026-12-01), its digest verified."""
    for name, runtime in profiles()["runtimes"].items():
        assert runtime_problems(runtime) == [], name
    (path,) = (REPO / "benchmarks" / "gpu" / "calibrate-2026-12-01" / "calibration").glob("*.yaml")
    assert choose.read_calibration(path)["runtime"]["bandwidth_efficiency"] == 0.8958
    assert runtime_problems(fitting.prior()) == []


def test_labels_name_every_tp_size_when_they_differ(tmp_path):
    write_calibration(tmp_path / "calibration")
    config = fast_config()
    config["tp"] = [1, 2]
    resolved = choose.resolve(validated(config), None, str(tmp_path / "calibration"))
    assert choose.labels(resolved) == (
        "TP 1: measured on NVIDIA H200 on 2026-12-01, largest deviation 4.2%; "
        "TP 2: not calibrated: measured runtime sglang-0.5.16-h200 (fitted to SGLang 0.5.16 measured on an H200)"
    )
    assert (
        choose.labels(validated(config))
        == "not calibrated: measured runtime sglang-0.5.16-h200 (fitted to SGLang 0.5.16 measured on an H200)"
    )


def test_a_plan_past_its_bound_is_refused_naming_the_calibration_and_the_key(tmp_path):
    """A calibration within every bound that makes the plan more than PLAN_BOUND times dearer than the same plan
    without it: plan_bound names the calibration's file and confirm_plan_hours; confirm_plan_hours at the plan's
    hours allows it, below them not; a calibration that prices the plan near the roofline is within the bound, and
    a plan without calibration has none."""
    slow = {**MEASURED_RUNTIME, "request_latency": 0.9}
    slow.update(dict.fromkeys(("bandwidth_efficiency", "compute_efficiency", "attention_bandwidth_efficiency"), 5e-5))
    path = write_calibration(tmp_path / "slow", runtime=slow)
    config = sglang_config()
    resolved = choose.resolve(config, environment_of(HOST), str(tmp_path / "slow"))
    bound = plan.plan_bound(resolved)
    assert bound["ratio"] > plan.PLAN_BOUND and not bound["allowed"]
    assert [(o["tp"], o["calibration"]) for o in bound["over"]] == [(1, str(path))]
    assert f"TP 1: priced by {path}, " in bound["problem"]
    assert f"set confirm_plan_hours: {math.ceil(bound['hours'])} to run this plan" in bound["problem"]
    assert bound["uncalibrated_hours"] == pytest.approx(sum(plan.cold_hours(plan.predict(config)).values()))
    for confirmed, allowed in ((math.ceil(bound["hours"]), True), (bound["hours"] / 2, False)):
        judged = plan.plan_bound({**resolved, "confirm_plan_hours": confirmed})
        assert judged["allowed"] is allowed and (judged["problem"] is None) is allowed
    write_calibration(tmp_path / "measured")
    near = plan.plan_bound(choose.resolve(config, environment_of(HOST), str(tmp_path / "measured")))
    assert 1 < near["ratio"] < plan.PLAN_BOUND and near["allowed"] and near["problem"] is None
    assert plan.plan_bound(config) is None
