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
    events = sorted({t for s, t in result["starts"].items()} | {result["starts"][s] + durations[s][1] for s in durations})
    for t in events:
        busy = sum(durations[s][0] for s in durations if result["starts"][s] <= t < result["starts"][s] + durations[s][1])
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
