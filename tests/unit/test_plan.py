"""The plan: cost of a configuration before it runs, packing, cached cells."""

from __future__ import annotations

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
