"""Metric definitions on hand-built request records."""

from __future__ import annotations

import pytest

from specsweep import metrics as m


def record(t0, times, tokens, n=None, error=None, verify=None, session="s", t_sched=None):
    return {"session": session, "turn": 0, "t_sched": t0 if t_sched is None else t_sched, "t0": t0,
            "chunk_times": times, "chunk_tokens": tokens, "output_tokens": sum(tokens) if n is None else n,
            "error": error, "verify_ct": verify}


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
    cell = m.cell_metrics([ok, failed, refused], tp=1)
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


def test_acceptance_length_undefined_for_ar():
    assert m.acceptance_length([record(0.0, [0.1, 0.2], [1, 1])]) is None


def test_queue_delay():
    assert m.queue_delay(record(2.0, [2.1], [1], t_sched=1.5)) == pytest.approx(0.5)


def test_summary_confidence_interval_brackets_the_estimate():
    values = [0.01 * i for i in range(1, 101)]
    s = m.summarise(values)
    assert s["n"] == 100
    assert s["mean"] == pytest.approx(0.505)
    for key in ("mean", "p50", "p90", "p99"):
        lo, hi = s[f"{key}_ci"]
        assert lo <= s[key] <= hi
    assert s["mean_ci"][1] - s["mean_ci"][0] < 0.15


def test_speedup_of_identical_runs_is_one_and_of_twice_as_fast_is_two():
    ar = [record(0.0, [0.1, 1.1], [1, 10], session=f"s{i}") for i in range(10)]
    fast = [record(0.0, [0.1, 0.6], [1, 10], session=f"s{i}") for i in range(10)]
    assert m.speedup(ar, ar)["speedup"] == pytest.approx(1.0)
    s = m.speedup(fast, ar)
    assert s["speedup"] == pytest.approx(1.1 / 0.6)
    lo, hi = s["speedup_ci"]
    assert lo - 1e-9 <= s["speedup"] <= hi + 1e-9


def test_definitions_come_from_the_code():
    defs = dict(m.definitions())
    for name in ("ttft", "tpot", "itl_per_token", "e2e", "output_throughput", "acceptance_length", "queue_delay"):
        assert defs[name] == getattr(m, name).__doc__.strip().splitlines()[0]
    assert "(t_last - t_first) / (N - N_first)" in defs["tpot"]
