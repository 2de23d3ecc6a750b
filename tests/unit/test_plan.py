"""The plan: cost of a configuration before it runs, packing, cached cells."""

from __future__ import annotations

import pytest

from conftest import fast_config, validated
from specsweep import plan
from specsweep.plan import pack


def test_packing_respects_gpus_and_its_lower_bound():
    durations = {"a8": (8, 100.0), "b1": (1, 400.0), "c4": (4, 200.0), "d4": (4, 200.0), "e1": (1, 50.0)}
    result = pack(durations, 8)
    assert result["lower_bound_s"] == max((800 + 400 + 800 + 800 + 50) / 8, 400)
    assert result["lower_bound_s"] <= result["makespan_s"] <= 1.15 * result["lower_bound_s"] + 100
    # never more GPUs in use than exist
    events = sorted(
        {t for s, t in result["starts"].items()} | {result["starts"][s] + durations[s][1] for s in durations}
    )
    for t in events:
        busy = sum(
            durations[s][0] for s in durations if result["starts"][s] <= t < result["starts"][s] + durations[s][1]
        )
        assert busy <= 8


def test_predictions_are_kept_for_later_invocations_of_the_same_plan(tmp_path, monkeypatch):
    config = validated(fast_config())
    memo = tmp_path / "cache"
    rows = plan.predict(config, str(memo))
    assert rows == plan.predict(config) and len(list((memo / "plan").glob("*.json"))) == 1

    def no_prediction(*args, **kwargs):
        raise AssertionError("predicted again")

    real = plan.predict_server
    monkeypatch.setattr(plan, "predict_server", no_prediction)
    assert plan.predict(config, str(memo)) == rows  # read back
    assert plan.predict({**config, "report": {"title": "other"}}, str(memo)) == rows  # the report is not in it
    with pytest.raises(AssertionError, match="predicted again"):
        plan.predict({**config, "warmup": config["warmup"] + 1}, str(memo))  # any other key is
    monkeypatch.setattr(plan, "predict_server", real)
    # a memo that cannot be written (here a file stands where its folder would be) or read is skipped
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "plan").write_text("a file, not a folder")
    assert plan.predict(config, str(blocked)) == rows
    next((memo / "plan").glob("*.json")).write_text("{not json")
    assert plan.predict(config, str(memo)) == rows


def test_a_simulated_clock_run_fast_is_predicted_to_take_that_many_times_less():
    """sim.time_scale 10: every modelled second of the plan (start-up, warm-up, measurement) is a tenth of one on
    the servers' clock, the job's own start is not; the server gets the scale on its command line."""
    from specsweep.jobs import server_job
    from specsweep.launcher import launch_command

    config = fast_config(time_scale=1)
    config["warmup"] = 2
    normal = validated(config)
    config["sim"]["time_scale"] = 10
    fast = validated(config)
    slow_rows, fast_rows = plan.predict(normal), plan.predict(fast)
    assert len(fast_rows) == len(slow_rows) == 4
    for slow_row, fast_row in zip(slow_rows, fast_rows):
        assert slow_row["warmup_s"] > 0 and slow_row["measure_s"] > 0
        for column in ("warmup_s", "measure_s"):
            assert fast_row[column] == pytest.approx(slow_row[column] / 10)
        for column in ("cold_startup_s", "warm_startup_s"):  # the simulated servers' start-up is one figure
            overhead = plan.JOB_OVERHEAD_SECONDS if slow_row[column] else 0.0
            assert fast_row[column] - overhead == pytest.approx((slow_row[column] - overhead) / 10)
        assert fast_row["cold_startup_s"] == fast_row["warm_startup_s"]
    assert sum(bool(row["cold_startup_s"]) for row in fast_rows) == 2  # one start-up per server
    argv, _ = launch_command(server_job(fast, 1, "ar"), 30000, 8192)
    assert argv[argv.index("--sim-time-scale") + 1] == "10.0"
    argv, _ = launch_command(server_job(normal, 1, "ar"), 30000, 8192)
    assert argv[argv.index("--sim-time-scale") + 1] == "1.0"


def test_the_plan_says_how_many_gpus_it_assumed_and_from_where(tmp_path, monkeypatch):
    """On a host without GPUs the plan packed onto 8 without a word; now the count says where it comes from."""
    from specsweep import gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpus, "gpu_inventory", lambda: [])  # nvidia-smi: none here
    count, source = gpus.plan_gpus(None)
    assert count == gpus.ASSUMED_GPUS == 8
    assert source.startswith("assumed: no GPU is visible here") and "set gpu_pool.devices" in source
    assert gpus.plan_gpus(4) == (4, "from gpu_pool.devices")
    monkeypatch.setattr(gpus, "gpu_inventory", lambda: [{"index": 0}, {"index": 1}])
    assert gpus.plan_gpus(None) == (2, "from nvidia-smi (this host's GPUs)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")  # granted by a scheduler
    assert gpus.plan_gpus(None) == (3, "from CUDA_VISIBLE_DEVICES")
    config = validated(fast_config())
    config["cache_dir"] = str(tmp_path / "cache")
    md = tmp_path / "plan.md"
    plan.write_plan(config, None, count, str(md), str(tmp_path / "plan.csv"), source)
    assert f"- GPUs: 8 ({source})" in md.read_text()


def test_the_plan_prints_both_budgets_the_verdict_one_as_a_range_and_a_lower_bound_below_it(tmp_path):
    """Exhaustive = the plan's GPU-hours; verdict from its least (cells stopping at their first sufficient look,
    predicted implied-slower cells free) to the exhaustive; the lower bound at or below the least. A method far
    faster than AR stops early; one predicted slower from a concurrency up is skipped between it and the top."""
    import re

    config = fast_config(requests=64)
    config["concurrency"] = [1, 2, 4, 8, 16]
    config["methods"].append({"name": "ddtree", "algorithm": "ddtree", "budget": 512})
    config["sim"]["gpu"] = "RTX-PRO-6000"  # a 512-node tree is predicted slower than AR from concurrency 4 on
    config = validated(config)
    config["cache_dir"] = str(tmp_path / "cache")
    md = tmp_path / "plan.md"
    result = plan.write_plan(config, None, 2, str(md), str(tmp_path / "plan.csv"))
    line = next(x for x in md.read_text().splitlines() if x.startswith("- budget"))
    found = re.search(r"exhaustive ([\d.e-]+) GPU-hours; verdict ([\d.e-]+) to ([\d.e-]+) GPU-hours", line)
    full, least, most = (float(x) for x in found.groups())
    bound = float(re.search(r"lower bound ([\d.e-]+) GPU-hours", line).group(1))
    assert full == most == pytest.approx(result["gpu_hours"], rel=0.05)
    assert bound <= least < most
    rows = plan.predict(config)
    ar = {(r["tp"], r["workload"], r["concurrency"]): r["measure_s"] for r in rows if r["method"] == "ar"}
    skipped = plan._predicted_implied(rows, ar)
    assert skipped and skipped == {r["path"] for r in rows if r["method"] == "ddtree" and r["concurrency"] == 8}


def test_under_budget_verdict_ar_starts_first_then_the_servers_whose_verdicts_the_plan_cannot_call():
    """DFlash is predicted far faster than AR (its cells decide at their first look); NGRAM is predicted close to
    AR's speed at concurrency 16 (that cell needs every look): it starts before DFlash, AR before both."""
    config = fast_config(requests=64)
    config["concurrency"] = [1, 4, 16]
    config["methods"].append({"name": "ngram", "algorithm": "ngram"})
    config["budget"] = "verdict"
    config = validated(config)
    rows = plan.predict(config)
    score = plan.uncertainty(rows, config)
    assert set(score) == {"tp1/dflash", "tp1/ngram"}
    assert score["tp1/ngram"] > score["tp1/dflash"]
    order = plan.verdict_priorities(rows, config, {"tp1/dflash": 3, "tp1/ngram": 2, "tp1/ar": 1})
    assert sorted(order, key=order.get, reverse=True) == ["tp1/ar", "tp1/ngram", "tp1/dflash"]
