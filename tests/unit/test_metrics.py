"""Metric definitions on hand-built request records."""

from __future__ import annotations

import pytest

from specsweep import metrics as m


def record(t0, times, tokens, n=None, error=None, verify=None, session="s", t_sched=None, kind="chat", t_end=None):
    return {
        "session": session,
        "turn": 0,
        "kind": kind,
        "t_sched": t0 if t_sched is None else t_sched,
        "t0": t0,
        "t_end": t_end,
        "chunk_times": times,
        "chunk_tokens": tokens,
        "output_tokens": sum(tokens) if n is None else n,
        "error": error,
        "verify_ct": verify,
    }


def test_multi_token_chunks():
    # first chunk at 0.5 s with 1 token, then chunks of 4 and 2 tokens
    r = record(0.0, [0.5, 0.7, 0.8], [1, 4, 2])
    assert m.ttft(r) == pytest.approx(0.5)
    assert m.e2e(r) == pytest.approx(0.8)
    assert m.tpot(r) == pytest.approx(0.3 / 6)
    assert m.itl_per_token(r) == pytest.approx([0.05] * 4 + [0.05] * 2)
    assert m.chunk_gaps(r) == pytest.approx([0.2, 0.1])
    assert m.interactivity(r) == pytest.approx(20.0)


def test_itl_is_per_token_not_per_chunk():
    r = record(0.0, [0.1, 0.5], [1, 8])
    assert m.itl_per_token(r) == pytest.approx([0.05] * 8)
    assert len(m.itl_per_token(r)) == 8


def test_single_token_output_has_no_tpot():
    r = record(0.0, [0.2], [1])
    assert m.ttft(r) == pytest.approx(0.2)
    assert m.tpot(r) is None and m.interactivity(r) is None
    assert m.itl_per_token(r) == []


def test_first_chunk_with_several_tokens_counts_in_tpot():
    r = record(1.0, [1.4, 1.6], [3, 2])
    assert m.tpot(r) == pytest.approx(0.2 / 2)


def test_failed_request_is_counted_not_dropped():
    ok = record(0.0, [0.1, 0.3], [1, 3], verify=1)
    failed = record(0.0, [0.1], [1], error="truncated")
    refused = record(0.0, [], [], n=0, error="connect")
    cell = m.cell_metrics([ok, failed, refused], tp=1, concurrency=1)
    assert cell["requests_sent"] == 3 and cell["requests_completed"] == 1 and cell["requests_failed"] == 2
    assert cell["failures"] == {"truncated": 1, "connect": 1}
    assert cell["output_tokens"] == 4
    assert cell["ttft"]["n"] == 1


def test_output_throughput_window():
    a = record(0.0, [0.5, 1.0], [1, 9])  # 10 tokens
    b = record(0.5, [1.0, 2.0], [1, 19])  # 20 tokens
    assert m.output_throughput([a, b]) == pytest.approx(30 / 2.0)


def test_acceptance_length_is_token_weighted_without_prefill_token():
    a = record(0.0, [0.1, 0.2, 0.3], [1, 5, 5], verify=2)  # 10 tokens after prefill in 2 rounds
    b = record(0.0, [0.1, 0.2], [1, 2], verify=2)  # 2 tokens in 2 rounds
    assert m.acceptance_length([a, b]) == pytest.approx(12 / 4)
    assert m.acceptance_length_per_request([a, b]) == pytest.approx((5 + 1) / 2)
    assert m.tokens_per_chunk([a, b]) == pytest.approx(12 / 3)


def test_acceptance_by_depth_from_the_servers_rounds_by_drafts_accepted():
    # two requests: rounds that accepted 0, 1, 3 drafts (h = [1, 1, 0, 1]) and 2, 2 drafts (h = [0, 0, 2])
    a, b = record(0.0, [0.1], [1]), record(0.0, [0.1], [1])
    a["correct_drafts_histogram"], b["correct_drafts_histogram"] = [1, 1, 0, 1], [0, 0, 2]
    failed = dict(record(0.0, [], [], error="timeout"), correct_drafts_histogram=[9])  # never counted
    depths = m.acceptance_by_depth([a, b, failed, record(0.0, [0.1], [1])])  # the last reports no histogram
    assert depths == pytest.approx([4 / 5, 3 / 5, 1 / 5])  # rounds with at least 1, 2, 3 drafts of 5 rounds
    assert sum(depths) == pytest.approx((0 + 1 + 3 + 2 + 2) / 5)  # the mean drafts accepted a round
    assert m.acceptance_by_depth([record(0.0, [0.1], [1])]) is None  # no build report: nothing assumed


def test_acceptance_length_undefined_for_ar():
    assert m.acceptance_length([record(0.0, [0.1, 0.2], [1, 1])]) is None


def test_queue_delay_and_ttft_as_the_user_sees_it():
    r = record(2.0, [2.1], [1], t_sched=1.5)  # due at 1.5 s, a slot free at 2.0 s, first token at 2.1 s
    assert m.queue_delay(r) == pytest.approx(0.5)
    assert m.ttft(r) == pytest.approx(0.1)
    assert m.user_ttft(r) == pytest.approx(0.6)
    cell = m.cell_metrics([r], tp=1, concurrency=1, load_model="poisson")
    assert cell["user_ttft"]["p50"] == pytest.approx(0.6) and cell["queue_delay"]["p50"] == pytest.approx(0.5)


def test_summary_confidence_interval_brackets_the_estimate():
    values = [0.01 * i for i in range(1, 101)]
    s = m.summarise(values)
    assert s["n"] == 100
    assert s["mean"] == pytest.approx(0.505)
    for key in ("mean", "p50", "p90", "p95"):
        lo, hi = s[f"{key}_ci"]
        assert lo <= s[key] <= hi
    assert s["mean_ci"][1] - s["mean_ci"][0] < 0.15
    assert s["p99_ci"] is None  # one value beyond p99 of 100: no interval claimed


def test_no_interval_below_the_minimum_number_of_sessions():
    few = m.summarise([0.1, 0.2, 0.3, 0.5, 0.4], seed=1)
    assert few["n"] == 5 and few["p50"] == pytest.approx(0.3)
    assert few["p50_ci"] is None and few["mean_ci"] is None
    one = m.summarise([0.2])
    assert one["n"] == 1 and one["mean_ci"] is None


def test_token_values_are_resampled_by_session_not_by_token():
    # 12 sessions, each with 50 identical per-token values: the sessions, not the 600 tokens, are the sample
    values, sessions = [], []
    for i in range(12):
        values += [0.01 * (i + 1)] * 50
        sessions += [f"s{i}"] * 50
    clustered = m.summarise(values, sessions, seed=3)
    naive = m.summarise(values, seed=3)
    width = lambda s: s["mean_ci"][1] - s["mean_ci"][0]
    assert width(clustered) > 4 * width(naive)


def test_steady_window_and_achieved_concurrency():
    # concurrency 2: two requests from 0 until 1.0 and 2.0; a third sent at 1.0, ends at 3.0 (alone from 2.0)
    a = record(0.0, [0.2, 1.0], [1, 9], session="a", t_end=1.0)
    b = record(0.0, [0.2, 2.0], [1, 19], session="b", t_end=2.0)
    c = record(1.0, [1.2, 3.0], [1, 19], session="c", t_end=3.0)
    assert m.steady_window([a, b, c], 2) == pytest.approx([0.0, 2.0])
    held = m.concurrency_report([a, b, c], 2)
    assert held["peak"] == 2 and held["mean"] == pytest.approx(5 / 3) and held["steady_mean"] == pytest.approx(2)
    assert held["window_share"] == pytest.approx(2 / 3)
    assert m.steady_window([a, b, c], 4) is None  # never reached: the label is not held
    assert m.concurrency_report([a, b, c], 4)["held"] is False
    # throughput in the window: tokens arriving in (0, 2]: a 10, b 20, c 1
    assert m.output_throughput([a, b, c], [0.0, 2.0]) == pytest.approx(31 / 2)
    assert m.output_throughput([a, b, c]) == pytest.approx(50 / 3)


def test_combined_launches_use_a_student_t_interval():
    out = m.combine_launches([10.0, 12.0, 11.0])
    assert out["mean"] == pytest.approx(11.0) and out["launches"] == 3
    assert out["ci"] == pytest.approx([11 - 4.303 / 3**0.5, 11 + 4.303 / 3**0.5])
    assert m.combine_launches([10.0])["ci"] is None


def serial(steps, step=0.1, per_step=1, prefix="s"):
    """A concurrency-1 cell: requests one after the other, request i taking steps[i] engine steps of ``step`` seconds,
    a chunk of ``per_step`` tokens at each."""
    out, t = [], 0.0
    for i, k in enumerate(steps):
        times = [t + step * (j + 1) for j in range(k)]
        out.append(record(t, times, [1] + [per_step] * (k - 1), session=f"{prefix}{i}", t_end=times[-1]))
        t = times[-1]
    return out


def test_speedup_uses_the_same_pairs_for_estimate_and_interval():
    ar = serial([10 + i for i in range(12)])
    fast = serial([4 + i % 3 for i in range(12)], per_step=3)
    assert m.speedup(ar, ar)["speedup"] == pytest.approx(1.0)
    s = m.speedup(fast, ar)
    assert s["speedup"] == pytest.approx(m.output_throughput(fast) / m.output_throughput(ar))
    assert s["pairs"] == 12
    lo, hi = s["speedup_ci"]
    assert lo < s["speedup"] < hi
    # a session that failed in the method's cell stays paired: its time counts against the method
    failed = [dict(r) for r in fast]
    failed[3] = dict(failed[3], error="truncated")
    s_failed = m.speedup(failed, ar)
    assert s_failed["pairs"] == 12 and s_failed["speedup"] < s["speedup"]
    # sessions only one cell has are left out of both sides
    extra = fast + serial([2], prefix="x")
    assert m.speedup(extra, ar)["pairs"] == 12
    # too few pairs: an estimate, no interval
    assert m.speedup(fast[:5], ar[:5])["speedup_ci"] is None


def test_median_ratio_is_paired_by_session_and_its_interval_covers_the_true_ratio():
    """Two cells of the same 30 sessions, each request's value its session's own level (shared by both cells, log
    sd 0.3) times the cell's median and its own noise (log sd 0.05): over 200 independent draws the 95% interval
    covers the true ratio of medians (1.1) at least 90% of the time, and is narrower than the unpaired spread; a
    cell against itself has ratio 1; sessions one cell lacks are left out."""
    import numpy as np

    rng = np.random.default_rng(7)
    covered, widths = 0, []
    for draw in range(200):
        level = rng.normal(0, 0.3, 30)
        a = [(float(np.exp(v + rng.normal(0, 0.05))), f"s{i}", "chat") for i, v in enumerate(level)]
        b = [(float(1.1 * np.exp(v + rng.normal(0, 0.05))), f"s{i}", "chat") for i, v in enumerate(level)]
        r = m.median_ratio(a, b, seed=draw)
        lo, hi = r["ratio_ci"]
        covered += lo <= 1.1 <= hi
        widths.append(hi / lo)
    assert covered >= 180, covered
    assert np.median(widths) < np.exp(2 * 1.96 * 0.3 / np.sqrt(30))  # pairing removes the sessions' spread
    same = m.median_ratio(a, a)
    assert same["ratio"] == 1.0 and same["pairs"] == 30
    assert m.median_ratio(a, b + [(5.0, "only-b", "chat")])["pairs"] == 30
    assert m.median_ratio(a[:5], b[:5])["ratio_ci"] is None  # too few pairs: no interval


def test_identical_sessions_give_no_zero_width_interval():
    same = serial([10] * 12)
    assert m.throughput_ci(same) is None
    assert m.relative_precision(same) is None


def test_definitions_are_whole_sentences_from_the_code():
    printed = m.definitions() + m.statistics()  # what the report prints, in its two lists
    names = [name for name, _ in printed]
    assert len(names) == len(set(names)), "a metric defined twice"
    for name, text in printed:
        assert text.endswith("."), f"{name}: cut mid-sentence: {text!r}"
        assert text.count("(") == text.count(")") and text.count("[") == text.count("]"), f"{name}: {text!r}"
        assert "  " not in text and "\n" not in text, name
    defs = dict(m.definitions())
    assert "(t_last - t_first) / (N - N_first)" in defs["tpot"]  # the formula of the code that computes it
    assert defs["steady_window"].endswith(
        "(closed loop; open loop: from the first to the last send); None when the concurrency was never reached."
    )
    assert "``pieces``" not in defs["achieved_concurrency"]  # the definition, not the notes on arguments
    assert "no CI below 10 sessions" in dict(m.statistics())["summarise"]  # MIN_SESSIONS given its value
