"""The simulated engine's clock: an absolute schedule of modelled steps, and its account of steps that ran late."""

from __future__ import annotations

import pytest

from conftest import load_default_config, patience, start_sim, validated
from specsweep.cells import measure_cell
from specsweep.client import measure
from specsweep.environment import probe
from specsweep.jobs import server_job
from specsweep.launcher import free_port, launch_command
from specsweep.sim.clock import StepClock
from specsweep.workloads import Session, build, workload_digest


class Host:
    """The host's clock in a test: time passes only where the test moves it."""

    def __init__(self, start: float = 100.0):
        self.t = start

    def __call__(self) -> float:
        return self.t


def run(clock: StepClock, host: Host, steps: list[tuple[float, float]]) -> list[float]:
    """Each (work, modelled) step as the engine runs it: its own work, then a wait for what is left to its deadline;
    the host's time when each step ends."""
    ends = []
    for work, modelled in steps:
        host.t += work
        host.t += clock.step(modelled)
        ends.append(host.t)
    return ends


def test_a_step_whose_work_is_shorter_than_modelled_ends_at_its_deadline():
    host = Host()
    clock = StepClock(now=host)
    clock.restart()
    # whatever part of its step the work takes, each step ends at the sum of the modelled seconds so far
    ends = run(clock, host, [(0.002, 0.010), (0.0099, 0.010), (0.0, 0.020), (0.005, 0.005)])
    assert ends == pytest.approx([100.010, 100.020, 100.040, 100.045], abs=1e-12)
    assert (clock.steps, clock.steps_late, clock.late_seconds) == (4, 0, 0.0)
    assert clock.scheduled_seconds == pytest.approx(0.045)


def test_a_step_whose_work_passes_its_deadline_is_counted_and_the_next_starts_from_its_end():
    host = Host()
    clock = StepClock(now=host)
    clock.restart()
    ends = run(clock, host, [(0.002, 0.010), (0.016, 0.010), (0.001, 0.010), (0.030, 0.010), (0.0, 0.010)])
    # the second step's work ends 6 ms past its deadline and the fourth's 20 ms past: each ends with its work, and
    # the step after it is a whole modelled step from there (the lost time is not made up)
    assert ends == pytest.approx([100.010, 100.026, 100.036, 100.066, 100.076], abs=1e-12)
    assert clock.steps == 5 and clock.steps_late == 2
    assert clock.late_seconds == pytest.approx(0.026)
    assert clock.scheduled_seconds == pytest.approx(0.050)
    assert clock.report() == {
        "steps": 5,
        "steps_late": 2,
        "late_seconds": clock.late_seconds,
        "scheduled_seconds": clock.scheduled_seconds,
    }


def test_a_scaled_clock_schedules_modelled_seconds_over_the_scale_and_an_idle_engine_restarts_it():
    host = Host()
    clock = StepClock(10.0, now=host)
    clock.restart()
    assert run(clock, host, [(0.0001, 0.010), (0.0, 0.020)]) == pytest.approx([100.001, 100.003], abs=1e-12)
    host.t += 5.0  # idle: no step runs, none is late
    clock.restart()
    assert run(clock, host, [(0.0002, 0.010)]) == pytest.approx([105.004], abs=1e-12)
    assert clock.steps_late == 0 and clock.scheduled_seconds == pytest.approx(0.004)


def test_the_servers_late_steps_are_reported_and_recorded_in_its_cell(tmp_path):
    """On a clock a million times fast every step's deadline (its modelled seconds / 1e6: about 10 ns) passes during
    its own work, so the server counts every step of the cell late; the cell records that count over its window
    (server counters) and the server's account since launch (provenance.server_info.sim_clock)."""
    config = load_default_config()
    config["methods"] = [{"name": "ar", "algorithm": "ar"}]
    config["workloads"] = [{"name": "short", "family": "short", "requests": 4, "max_new_tokens": 24}]
    config["concurrency"] = [2]
    config["warmup"] = 0
    config = validated(config)
    params = server_job(config, 1, "ar")
    argv, env = launch_command(params, free_port(), 8192)
    server = start_sim(tmp_path, "--sim-time-scale", "1000000")
    try:
        chunks: list[dict] = []
        waves = [Session(f"s{i}", "chat", [{"role": "user", "content": f"Count to {i}."}], [], 16) for i in range(3)]
        measure(
            server.url, waves, 3, {"ignore_eos": True}, timeout=patience(12), on_chunk=lambda _, c: chunks.append(c)
        )
        sessions = build(params.workloads[0], 0)
        cell = {
            "tp": 1,
            "method": "ar",
            "workload": "short",
            "concurrency": 2,
            "repetition": 0,
            "requests": 4,
            "output": "results/cells/x.json",
            "key": "0" * 64,
        }
        result = measure_cell(server, params, cell, sessions, workload_digest(sessions), probe("sim"), argv, env)
    finally:
        server.stop()
    # every chunk names its engine step; a running request gets one in every step until its last
    by_request: dict[str, list[int]] = {}
    for chunk in chunks:
        by_request.setdefault(chunk["meta_info"]["id"], []).append(chunk["meta_info"]["sim_step"])
    assert len(by_request) == 3
    for seen in by_request.values():
        assert seen == list(range(seen[0], seen[0] + 16))
    counters = result.server_counters
    steps = counters["sglang:cuda_graph_passes_total"]
    assert steps > 0
    assert counters["specsweep_sim:steps_late_total"] == steps
    assert counters["specsweep_sim:late_seconds_total"] > 0
    assert 0 < counters["specsweep_sim:scheduled_seconds_total"] < counters["specsweep_sim:late_seconds_total"]
    since_launch = result.provenance["server_info"]["sim_clock"]
    assert since_launch["steps_late"] == since_launch["steps"] >= steps + 16
    assert since_launch["late_seconds"] >= counters["specsweep_sim:late_seconds_total"]
