"""budget: verdict's sequential speedup interval and its stopping rule (specsweep.sequential).

Coverage is checked by repeated independent draws: each draw makes a paired cell of sessions with a known true
speedup, looks at it as a cell under budget: verdict does (its looks, its alpha split, its stopping rule) and keeps
the interval of the look it stopped at. The truth is known by construction, so the coverage is exact up to the
draws' own binomial error.
"""

from __future__ import annotations

import numpy as np
import pytest

from specsweep import sequential
from specsweep.metrics import MIN_SESSIONS


def paired_sessions(rng, n: int, truth: float, spread: float = 0.25):
    """``n`` sessions run by AR and by a method ``truth`` times faster: each session's tokens are the same on both
    sides (the same prompts, greedy), its seconds per token log-normal around each side's mean, independently.
    Throughput = sum(tokens) / sum(seconds), so the true speedup is E[s_ar] / E[s_method] = truth."""
    tokens = rng.integers(50, 400, size=n).astype(float)
    ar = tokens * np.exp(rng.normal(-(spread**2) / 2, spread, size=n))
    method = tokens * np.exp(rng.normal(-(spread**2) / 2, spread, size=n)) / truth
    return tokens, method, ar


def stopped_interval(tokens, method, ar, settings: dict) -> dict:
    """The look a cell stops at: every look in order (sequential.look_sessions), each at its alpha, stopping at
    the first decided one or the last."""
    counts = sequential.look_sessions(len(tokens), settings["looks"])
    alphas = sequential.look_alphas(counts, settings["level"])
    for n, alpha in zip(counts, alphas):
        look = sequential.log_ratio_interval(
            (tokens[:n], method[:n], 1.0), (tokens[:n], ar[:n], 1.0), ["short"] * n, alpha
        )
        decision = sequential.decide(look["speedup_ci"], settings["equivalence"])
        if decision != sequential.UNDECIDED:
            break
    return {**look, "decision": decision, "sessions": n}


def coverage(truth: float, settings: dict, draws: int = 1500, n: int = 64, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    covered, used, decided = 0, 0, 0
    for _ in range(draws):
        look = stopped_interval(*paired_sessions(rng, n, truth), settings)
        lo, hi = look["speedup_ci"]
        covered += lo <= truth <= hi
        used += look["sessions"]
        decided += look["decision"] != sequential.UNDECIDED
    return {"coverage": covered / draws, "sessions": used / draws, "decided": decided / draws}


@pytest.mark.parametrize("level", [0.90, 0.95, 0.99])
@pytest.mark.parametrize("truth", [1.0, 1.04, 1.15])
def test_the_interval_of_the_look_stopped_at_covers_the_true_speedup_at_its_level(level, truth):
    settings = {"looks": 4, "equivalence": 0.03, "level": level}
    row = coverage(truth, settings, seed=int(level * 1000 + truth * 100))
    # at least the level, less three binomial standard errors of 1500 draws
    assert row["coverage"] >= level - 3 * np.sqrt(level * (1 - level) / 1500), row


def test_looking_four_times_at_the_nominal_level_undercovers_where_the_truth_is_one():
    """Why the alpha is split: stopping at the first of four looks whose nominal 95% interval excludes 1 claims a
    difference that is not there in well over 5% of draws (the check above would fail it)."""
    settings = {"looks": 4, "equivalence": 0.0, "level": 0.95}
    rng = np.random.default_rng(7)
    counts = sequential.look_sessions(64, 4)
    flagged = 0
    draws = 1500
    for _ in range(draws):
        tokens, method, ar = paired_sessions(rng, 64, 1.0)
        for n in counts:
            ci = sequential.log_ratio_interval(
                (tokens[:n], method[:n], 1.0), (tokens[:n], ar[:n], 1.0), ["short"] * n, 0.05
            )["speedup_ci"]
            if sequential.decide(ci, settings["equivalence"]) != sequential.UNDECIDED:
                flagged += 1
                break
    assert flagged / draws > 0.08
    split = coverage(1.0, {**settings, "looks": 4}, seed=8)
    assert split["coverage"] >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / 1500)


def test_a_clear_difference_stops_early_and_a_small_one_runs_to_the_cap():
    settings = {"looks": 4, "equivalence": 0.03, "level": 0.95}
    clear = coverage(1.6, settings, draws=200, seed=3)
    assert clear["decided"] == 1.0 and clear["sessions"] < 64 * 0.5
    close = coverage(1.06, settings, draws=200, n=32, seed=4)  # neither decided nor inside the band in most draws
    assert close["sessions"] > 32 * 0.8


def test_looks_are_evenly_spaced_with_the_last_at_the_cap_and_the_alphas_sum_to_one_minus_the_level():
    assert sequential.look_sessions(64, 4) == [16, 32, 48, 64]
    assert sequential.look_sessions(32, 4) == [MIN_SESSIONS, 16, 24, 32]
    assert sequential.look_sessions(12, 4) == [MIN_SESSIONS, 12]
    alphas = sequential.look_alphas([16, 32, 48, 64], 0.95)
    assert sum(alphas) == pytest.approx(0.05)
    assert alphas == sorted(alphas) and alphas[-1] == pytest.approx(0.05 * 64 / 160)


@pytest.mark.parametrize(
    "ci, decision",
    [
        ([1.05, 1.3], sequential.FASTER),
        ([0.7, 0.95], sequential.SLOWER),
        ([0.985, 1.02], sequential.EQUIVALENT),
        ([0.96, 1.1], sequential.UNDECIDED),
        (None, sequential.UNDECIDED),
    ],
)
def test_a_look_is_decided_faster_slower_equivalent_or_not(ci, decision):
    assert sequential.decide(ci, 0.03) == decision


def records(session_seconds: dict[str, tuple[int, float]], start: float = 0.0) -> list[dict]:
    """One request per session, one after another at concurrency 1: (tokens, seconds) each."""
    out, clock = [], start
    for session, (tokens, seconds) in session_seconds.items():
        times = list(np.linspace(clock + seconds / tokens, clock + seconds, tokens))
        out.append(
            {
                "session": session,
                "turn": 0,
                "kind": "short",
                "t_sched": clock,
                "t0": clock,
                "t_end": clock + seconds,
                "chunk_times": times,
                "chunk_tokens": [1] * tokens,
                "output_tokens": tokens,
                "error": None,
            }
        )
        clock += seconds
    return out


def constructed_cell(factor: float, n: int = 40, seed: int = 0, noise_sd: float = 0.05):
    """AR's cell and a method's of ``n`` single-request sessions at concurrency 1, the method ``factor`` times
    AR's throughput (``noise_sd`` log-normal noise per session)."""
    rng = np.random.default_rng(seed)
    ids = [f"s{i:03d}" for i in range(n)]
    tokens = rng.integers(80, 200, size=n)
    noise = np.exp(rng.normal(0, noise_sd, size=(2, n)))
    ar = records({s: (int(t), t * 0.02 * e) for s, t, e in zip(ids, tokens, noise[0])})
    method = records({s: (int(t), t * 0.02 * e / factor) for s, t, e in zip(ids, tokens, noise[1])})
    return ids, ar, method


@pytest.mark.parametrize(
    "factor, noise_sd, decision",
    [(1.5, 0.05, sequential.FASTER), (0.6, 0.05, sequential.SLOWER), (1.0, 0.01, sequential.EQUIVALENT)],
)
def test_constructed_cells_stop_at_their_first_decided_look(factor, noise_sd, decision):
    ids, ar, method = constructed_cell(factor, noise_sd=noise_sd)
    looks = sequential.Looks(ids, {s: 1 for s in ids}, ar, 1, {"looks": 4, "equivalence": 0.03})
    stopped = None
    for i in range(1, len(method) + 1):  # the loop asks after each finished request
        stopped = looks.step(method[:i])
        if stopped:
            break
    assert stopped is not None and stopped["decision"] == decision
    assert stopped["sessions"] < len(ids)  # before its cap
    record = looks.record("decided")
    assert record["look_sessions"] == ids[: stopped["sessions"]] and record["decision"] == decision
    # the tables compute the same interval again from the records (what the aggregate reads)
    cell = {"precision": record, "requests": method, "cell": {"concurrency": 1}, "load": {"model": "closed"}}
    again = sequential.verdict_interval(cell, {"requests": ar})
    assert again is not None and again["speedup_ci"] == stopped["speedup_ci"]


def test_a_cell_close_to_ar_but_outside_the_band_reaches_its_cap_undecided():
    ids, ar, method = constructed_cell(1.03, n=24, seed=5, noise_sd=0.1)
    looks = sequential.Looks(ids, {s: 1 for s in ids}, ar, 1, {"looks": 4, "equivalence": 0.01, "level": 0.99})
    assert all(looks.step(method[:i]) is None for i in range(1, len(method) + 1))
    assert [t["sessions"] for t in looks.taken] == looks.counts and looks.counts[-1] == len(ids)
    assert looks.record("session cap: undecided")["decision"] == sequential.UNDECIDED


def test_a_look_waits_until_every_request_of_its_sessions_has_finished():
    ids, ar, method = constructed_cell(1.5)
    looks = sequential.Looks(ids, {s: 2 if s == "s003" else 1 for s in ids}, ar, 1, {"looks": 4})
    assert looks.ready(method[: looks.counts[0]]) == []  # s003's second turn has not finished
    assert sequential.verdict_interval({"precision": {"budget": None}}, {"requests": ar}) is None


def test_a_look_before_the_last_counts_at_least_two_waves_of_sessions():
    """The first wave of a closed loop starts together, a transient the later waves do not share (on the simulator
    at concurrency 64 AR's first wave ran 17.5% above the rest of its cell and a look of it alone called a cell of
    exhaustive speedup 1.07 slower): no look before the last counts fewer than two waves, so a cell of two waves has
    one look, at its cap; the plan's predicted stop uses the same looks."""
    assert sequential.look_sessions(256, 4, concurrency=64) == [128, 192, 256]
    assert sequential.look_sessions(128, 4, concurrency=64) == [128]
    assert sequential.look_sessions(64, 4, concurrency=16) == [32, 48, 64]
    assert sequential.look_sessions(64, 4, concurrency=1) == [16, 32, 48, 64]  # two waves are two sessions
    ids = [f"s{i}" for i in range(256)]
    assert sequential.Looks(ids, {s: 1 for s in ids}, [], 64, {"looks": 4}).counts == [128, 192, 256]
    # a speedup the first look at 64 sessions would decide stops at the two waves' look instead
    decided = {"looks": 4, "equivalence": 0.03, "level": 0.95}
    assert sequential.stopping_sessions(256, 0.5, decided) == 64
    assert sequential.stopping_sessions(256, 0.5, decided, concurrency=64) == 128


def waves_cell(rng, tokens, concurrency: int, seconds_per_token: float, first_wave_gain: float) -> list[dict]:
    """A closed loop's cell of single-request sessions of ``tokens`` output tokens each, in waves of ``concurrency``
    (slot j runs sessions j, j + concurrency, ...): each session's seconds log-normal (sd 0.05) around its tokens x
    ``seconds_per_token``, the first wave, started together, ``first_wave_gain`` times faster; every output token in
    one chunk at its end."""
    cap = len(tokens)
    seconds = tokens * seconds_per_token * np.exp(rng.normal(0, 0.05, size=cap))
    seconds[:concurrency] /= first_wave_gain
    clock = np.zeros(concurrency)
    out = []
    for i in range(cap):
        slot = i % concurrency
        t0, clock[slot] = clock[slot], clock[slot] + seconds[i]
        out.append(
            {
                "session": f"s{i:03d}",
                "turn": 0,
                "kind": "short",
                "t_sched": t0,
                "t0": t0,
                "t_end": clock[slot],
                "chunk_times": [clock[slot]],
                "chunk_tokens": [int(tokens[i])],
                "output_tokens": int(tokens[i]),
                "error": None,
            }
        )
    return out


def test_a_look_before_the_last_weighs_the_first_wave_as_the_whole_cell_does():
    """A first wave that AR gains more from (as on the simulator at concurrency 64: AR 17.5% above the rest of its
    cell, EAGLE-3 3.5%) is half of a look of two waves but a quarter of a cell of four. Counted one for one, the first
    look estimates a speedup of its own, 3% below the cell's, and its interval (at alpha_1, sessions with 5% noise)
    misses the cell's speedup in most draws; weighed as in the whole cell it covers at its level. Repeated
    independent cells; the cell's speedup is known by construction (the tokens are the same on both sides, so it is
    the ratio of the expected seconds: truth x (c / 1.175 + n - c) / (c / 1.035 + n - c))."""
    concurrency, cap, truth, draws = 64, 256, 1.1, 300
    ids = [f"s{i:03d}" for i in range(cap)]
    weights = sequential.first_wave_weights(ids[:128], concurrency, cap)
    assert weights["s000"] == weights["s063"] == pytest.approx(1 / 3) and weights["s064"] == 1.0
    assert set(sequential.first_wave_weights(ids[:64], concurrency, cap).values()) == {1.0}
    whole = truth * (concurrency / 1.175 + cap - concurrency) / (concurrency / 1.035 + cap - concurrency)
    rng = np.random.default_rng(11)
    covered = counted_alike = 0
    for _ in range(draws):
        tokens = rng.integers(50, 400, size=cap)  # the same prompts on both sides
        ar = waves_cell(rng, tokens, concurrency, 0.02, 1.175)
        method = waves_cell(rng, tokens, concurrency, 0.02 / truth, 1.035)
        looks = sequential.Looks(ids, {s: 1 for s in ids}, ar, concurrency, {"looks": 4})
        first = looks.take(0, method)
        lo, hi = first["speedup_ci"]
        covered += lo <= whole <= hi
        assert first["sessions"] == 128
        unweighted = sequential.log_ratio_interval(
            *(
                (
                    np.array([float(r["output_tokens"]) for r in side[:128]]),
                    np.array([r["t_end"] - r["t0"] for r in side[:128]]),
                    1.0,
                )
                for side in (method, ar)
            ),
            ["short"] * 128,
            first["alpha"],
        )["speedup_ci"]
        counted_alike += unweighted[0] <= whole <= unweighted[1]
    level = 1 - looks.alphas[0]
    assert covered / draws >= level - 3 * np.sqrt(level * (1 - level) / draws), covered
    assert counted_alike / draws < 0.5, counted_alike
    # the tables compute a stopped cell's interval again by the rule it stopped by: a cell measured before the
    # weights (its precision without ``first_wave``) counts its first wave one for one, as it did when it stopped
    record = looks.record("decided")
    cell = {"precision": record, "requests": method, "cell": {"concurrency": concurrency}}
    assert record["first_wave"] == sequential.FIRST_WAVE_WEIGHED
    assert sequential.verdict_interval(cell, {"requests": ar})["speedup_ci"] == first["speedup_ci"]
    older = {**cell, "precision": {k: v for k, v in record.items() if k != "first_wave"}}
    assert sequential.verdict_interval(older, {"requests": ar})["speedup_ci"] == pytest.approx(unweighted)


def test_a_look_counts_its_first_sessions_by_start_order_whichever_others_have_finished():
    """What lets budget: verdict abort the sessions under way: look 1 counts the first n_1 sessions of the start
    order, not the first n_1 to finish. More than n_1 sessions finished without one of the first n_1 is no look; once
    they have all finished, the look is the same whatever later sessions have finished or were cut short."""
    ids, ar, method = constructed_cell(1.5)
    n = sequential.look_sessions(len(ids), 4)[0]
    later = method[n : n + 5]
    settings = {"looks": 4}
    early = sequential.Looks(ids, {s: 1 for s in ids}, ar, 1, settings)
    assert early.ready(method[1:n] + later) == []  # n + 4 finished, the first one not
    alone = sequential.Looks(ids, {s: 1 for s in ids}, ar, 1, settings).take(0, method[:n])
    for extra in ([], later[:1], later):
        looks = sequential.Looks(ids, {s: 1 for s in ids}, ar, 1, settings)
        assert looks.ready(method[:n] + extra) == [0]
        assert looks.take(0, extra + method[:n]) == alone


@pytest.mark.parametrize(
    "change, words",
    [
        ({"adaptive": {"enabled": True}}, "budget: verdict and adaptive.enabled both stop a cell early"),
        ({"repetitions": 2}, "repetitions: 2 is not supported with it"),
        ({"load": {"model": "poisson", "rate": 2.0}}, "it needs load.model: closed and load.think_time: 0"),
    ],
)
def test_budget_verdict_refuses_what_its_looks_cannot_stop(change, words):
    from conftest import fast_config, validated

    from specsweep.errors import ConfigError

    config = {**fast_config(), "budget": "verdict", **change}
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        validated(config)
    assert validated(fast_config())["budget"] == "exhaustive"


def test_exhaustive_cells_keep_their_keys_and_only_speculative_servers_stop_under_budget_verdict():
    from conftest import fast_config, validated

    from specsweep import jobs
    from specsweep.cells import keyed_cells

    exhaustive = validated(fast_config())
    tighter = validated({**fast_config(), "verdict_stopping": {"looks": 8}})  # read only under budget: verdict
    verdict_config = validated({**fast_config(), "budget": "verdict"})
    assert "budget" not in jobs.server_job(exhaustive, 1, "dflash").as_dict()

    def keys(config, method):
        return [c["key"] for c in keyed_cells(jobs.server_job(config, 1, method), "identity")[0]]

    assert keys(exhaustive, "dflash") == keys(tighter, "dflash")
    assert keys(exhaustive, "ar") == keys(verdict_config, "ar")  # AR measures every session under both
    assert jobs.server_job(verdict_config, 1, "ar").budget is None
    assert jobs.server_job(verdict_config, 1, "dflash").budget == {"looks": 4, "equivalence": 0.03, "level": 0.95}
    assert set(keys(verdict_config, "dflash")).isdisjoint(keys(exhaustive, "dflash"))
    assert jobs.verdict_reference_cells(verdict_config, 1, "dflash") == [
        c["path"] for c in jobs.cells_of_server(verdict_config, 1, "ar")
    ]
    assert jobs.verdict_reference_cells(exhaustive, 1, "dflash") == []


def test_on_the_simulator_the_interval_a_cell_stops_at_covers_the_mean_of_independent_draws():
    """Independent prompt draws (another seed each) of AR's and DFlash's cell at concurrency 4 on the simulated
    engine in virtual time, stopped as budget: verdict stops them (the looks taken before each new session starts);
    the truth is the mean of the draws' speedups over every session (as ci_coverage takes it). With 24 draws the
    bound is loose, as ci_coverage's test has it: a calibrated interval covers 21-24 of them."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import verdict_budget

    from specsweep.sim.replay import closed_loop, engine
    from specsweep.workloads import build

    settings = {"looks": 4, "equivalence": 0.03, "level": 0.95}
    draws, estimates = [], []
    for seed in range(3000, 3024):
        sessions = build({"name": "short", "family": "short", "requests": 32, "max_new_tokens": 96}, seed=seed)
        ar = closed_loop(engine("ar"), sessions, 4)
        records = closed_loop(engine("dflash", random_seed=seed), sessions, 4)
        whole = sequential.look_interval(records, ar, [s.id for s in sessions], 4, 0.05, final=True, cap=32)
        estimates.append(whole["speedup"])
        draws.append(verdict_budget.stopped(records, sessions, ar, 4, settings))
    truth = float(np.mean(estimates))
    covered = [d["look"]["speedup_ci"][0] <= truth <= d["look"]["speedup_ci"][1] for d in draws]
    assert sum(covered) >= 21, (truth, [d["look"] for d in draws])
    assert any(d["sessions"] < 32 for d in draws)  # the stopping rule was exercised
