"""Service-level objectives: requests judged per request on hand-built timings, attainment with an interval that
covers the truth over independent draws, goodput, the highest concurrency meeting an SLO, and the configuration's
mistakes named by their key."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import load_default_config
from specsweep import config as cfg
from specsweep import metrics as m
from specsweep.slo import Objective, Slo, capacity, cell_states, column, combined_columns, judge

from .test_config import checked


def record(t0, times, tokens, error=None, session="s", kind="chat", turn=0):
    return {
        "session": session,
        "turn": turn,
        "kind": kind,
        "t_sched": t0,
        "t0": t0,
        "t_end": times[-1] if times else t0,
        "chunk_times": times,
        "chunk_tokens": tokens,
        "output_tokens": sum(tokens),
        "error": error,
        "verify_ct": None,
    }


# four requests with hand-checked timings (seconds):
#   a: TTFT 0.5, TPOT (1.5 - 0.5) / 9 = 0.111, per-token ITL 0.5/4 = 0.125 (4 tokens) and 0.5/5 = 0.1 (5 tokens)
#   b: TTFT 0.2, TPOT 0.4 / 4 = 0.1, per-token ITL 0.1
#   c: TTFT 3.0, TPOT 0.2 / 3 = 0.067, per-token ITL 0.067
#   d: failed after its first chunk
A = record(0.0, [0.5, 1.0, 1.5], [1, 4, 5], session="a")
B = record(0.0, [0.2, 0.4, 0.6], [1, 2, 2], session="b")
C = record(0.0, [3.0, 3.2], [1, 3], session="c")
D = record(0.0, [0.1], [1], error="timeout", session="d")
CELL = [A, B, C, D]


def targets(ttft=None, tpot=None, itl=None):
    return Objective("x", ttft, tpot, itl).targets


@pytest.mark.parametrize(
    "slo,met",
    [
        (targets(ttft=1000, tpot=105), {"b"}),  # a's TPOT (111 ms) misses, c's TTFT misses
        (targets(ttft=1000, tpot=120), {"a", "b"}),
        (targets(itl=110), {"b", "c"}),  # a's worst token waited 125 ms
        (targets(itl=125), {"a", "b", "c"}),  # at the target is within it
        (targets(ttft=5000), {"a", "b", "c"}),  # a failed request meets no SLO, however fast its first chunk
    ],
)
def test_a_request_meets_an_slo_when_it_succeeded_and_every_target_it_sets_holds(slo, met):
    assert {r["session"] for r in CELL if m.slo_met(r, slo)} == met


def test_a_request_whose_tokens_came_in_one_chunk_has_no_tpot_and_meets_a_tpot_target():
    one = record(0.0, [0.3], [7])
    assert m.tpot(one) is None and m.slo_met(one, targets(ttft=500, tpot=1))
    assert not m.slo_met(one, targets(ttft=200, tpot=1))


def test_attainment_counts_failed_requests_as_missing_and_states_a_wilson_interval_below_ten_sessions():
    out = m.slo_attainment(CELL, targets(ttft=1000, tpot=120))
    assert (out["met"], out["sent"], out["sessions"]) == (2, 4, 4)
    assert out["share"] == 0.5
    # the Wilson score interval of 2 of 4 (published tables: 0.150 to 0.850); no bootstrap below 10 sessions
    assert out["share_ci"] == pytest.approx([0.1500, 0.8500], abs=5e-4)


def test_every_request_meeting_the_slo_still_has_an_interval_below_one():
    cell = [record(0.0, [0.1, 0.2], [1, 3], session=f"s{i}") for i in range(32)]
    out = m.slo_attainment(cell, targets(ttft=1000, tpot=50))
    assert out["share"] == 1.0
    lo, hi = out["share_ci"]
    assert hi == 1.0 and lo == pytest.approx(32 / (32 + 1.959964**2))  # 0.893: 32 sessions cannot show 0.9
    assert lo < 0.9


def test_goodput_counts_the_tokens_and_requests_of_those_meeting_the_slo_inside_the_window():
    slo = targets(ttft=1000, tpot=120)  # a and b meet it
    # the whole window (0, 2]: a's 10 tokens and b's 5 over 2 s; both ended inside it
    assert m.goodput(CELL, slo, [0.0, 2.0]) == pytest.approx(15 / 2.0)
    assert m.request_goodput(CELL, slo, [0.0, 2.0]) == pytest.approx(2 / 2.0)
    # (0.3, 1.2]: a's chunks at 0.5 and 1.0 (5 tokens), b's at 0.4 and 0.6 (4); only b ended inside it
    assert m.goodput(CELL, slo, [0.3, 1.2]) == pytest.approx(9 / 0.9)
    assert m.request_goodput(CELL, slo, [0.3, 1.2]) == pytest.approx(1 / 0.9)
    # none meets it: no goodput, and no interval
    assert m.goodput(CELL, targets(ttft=1), [0.0, 2.0]) == 0.0
    assert m.goodput_ci(CELL, targets(ttft=1), [0.0, 2.0]) is None


def serial(gaps: list[float], tokens: int = 10) -> list[dict]:
    """One request per session, one after another, session i a token each gaps[i] seconds."""
    out, t = [], 0.0
    for i, gap in enumerate(gaps):
        times = [t + gap * (k + 1) for k in range(tokens)]
        out.append(record(t, times, [1] * tokens, session=f"s{i}"))
        t = times[-1]
    return out


def test_goodput_is_throughput_when_every_request_meets_the_slo_and_its_interval_the_same():
    gaps = [0.01, 0.03, 0.012, 0.025, 0.015, 0.04, 0.011, 0.02, 0.035, 0.018, 0.03, 0.014]
    cell = serial(gaps)
    everything = targets(ttft=1000, tpot=1000)
    assert m.goodput(cell, everything) == pytest.approx(m.output_throughput(cell))
    ci = m.throughput_ci(cell, seed=3)
    assert ci is not None and m.goodput_ci(cell, everything, seed=3) == ci
    # TPOT <= 20 ms: 7 of the 12 sessions; their 70 tokens over the whole run
    some = targets(tpot=20)
    assert m.goodput(cell, some) == pytest.approx(70 / sum(10 * g for g in gaps))
    lo, hi = m.goodput_ci(cell, some, seed=3)
    assert lo < m.goodput(cell, some) < hi
    assert lo < ci[0] and hi < ci[1]  # in every resample the tokens meeting it are a part of all tokens


def draw_cell(rng, sessions: int, turns: int, share: float, spread: float) -> list[dict]:
    """A cell of ``sessions`` sessions of ``turns`` requests, each request meeting a TTFT target of 1 s with its
    session's own probability (Beta around ``share``; ``spread`` 0: every session alike), two content kinds."""
    out = []
    for s in range(sessions):
        p = rng.beta(share / spread, (1 - share) / spread) if spread else share
        for t in range(turns):
            first = 0.1 if rng.random() < p else 3.0
            out.append(
                record(0.0, [first, first + 0.1], [1, 4], session=f"s{s}", kind="chat" if s % 2 else "code", turn=t)
            )
    return out


@pytest.mark.parametrize(
    "sessions,turns,share,spread",
    [
        (40, 3, 0.8, 0.2),  # sessions of three turns that differ from one another: the share clusters by session
        (40, 1, 0.97, 0),  # near 1: every request meets it in 30% of the draws, where every resample gives 1
        (12, 1, 0.85, 0),  # just above the least number of sessions for a bootstrap
    ],
)
def test_the_attainment_interval_covers_the_true_share_over_independent_draws(sessions, turns, share, spread):
    """Over 300 independent draws of a cell the 95% interval holds the true share (the mean of the sessions'
    probabilities: every session sends as many requests) 92-99.7% of the time, and its half-width is within 0.7-1.5
    times 1.96 standard deviations of the draws' shares: the turns of one session count as fewer requests (not as
    one, nor as independent ones), and near 1 the Wilson bound keeps it covering where the bootstrap cannot."""
    rng = np.random.default_rng(11)
    covered, widths, shares = 0, [], []
    for draw in range(300):
        out = m.slo_attainment(draw_cell(rng, sessions, turns, share, spread), {"ttft_ms": 1000}, seed=draw)
        lo, hi = out["share_ci"]
        covered += lo <= share <= hi
        widths.append(hi - lo)
        shares.append(out["share"])
    assert 0.92 * 300 <= covered <= 0.997 * 300, covered
    assert 0.7 <= np.mean(widths) / 2 / (1.96 * np.std(shares, ddof=1)) <= 1.5


def combined_frame(shares: dict[str, list[tuple]]) -> pd.DataFrame:
    """combined.csv rows of one workload at TP 1: per method, (concurrency, share_lo, share_hi) with throughput per
    GPU 100 x concurrency."""
    rows = []
    for method, levels in shares.items():
        for c, lo, hi in levels:
            rows.append(
                {
                    "tp": 1,
                    "workload": "short",
                    "method": method,
                    "concurrency": c,
                    "output_throughput_per_gpu": 100.0 * c,
                    "simulated": True,
                    column("chat", "share"): (lo + hi) / 2,
                    column("chat", "share_lo"): lo,
                    column("chat", "share_hi"): hi,
                    column("chat", "goodput_per_gpu"): 90.0 * c,
                    column("chat", "state"): None,
                }
            )
    return pd.DataFrame(rows)


def test_the_highest_concurrency_meeting_an_slo_is_where_the_share_lower_bound_reaches_the_attainment():
    slo = Slo((Objective("chat", ttft_ms=2000, tpot_ms=50),), 0.9)
    frame = judge(
        combined_frame(
            {
                "ar": [(1, 0.95, 1.0), (4, 0.9, 1.0), (16, 0.5, 0.7)],  # met at 4 (at the bound is met), missed at 16
                "dflash": [(1, 0.85, 1.0), (4, 0.6, 0.89)],  # undecided at 1, missed at 4: met nowhere
                "ddtree": [(1, 0.93, 1.0), (4, 0.88, 0.97), (16, 0.91, 0.99)],  # met at 1 and 16, undecided at 4
            }
        ),
        slo,
    )
    table = capacity(frame, slo).set_index("method")
    assert table.loc["ar", "highest_concurrency"] == 4
    assert table.loc["ar", "output_throughput_per_gpu"] == 400.0 and table.loc["ar", "goodput_per_gpu"] == 360.0
    assert table.loc["ar", "share_lo"] == 0.9
    assert table.loc["ar", "levels"] == "1 met; 4 met; 16 missed"
    assert pd.isna(table.loc["dflash", "highest_concurrency"]) and pd.isna(table.loc["dflash", "share"])
    assert table.loc["dflash", "levels"] == "1 undecided; 4 missed"
    assert table.loc["ddtree", "highest_concurrency"] == 16
    assert table.loc["ar", "targets"] == "TTFT <= 2000 ms, TPOT <= 50 ms" and table.loc["ar", "attainment"] == 0.9
    # at a lower attainment more is met
    looser = Slo(slo.objectives, 0.8)
    assert capacity(judge(frame, looser), looser).set_index("method").loc["dflash", "highest_concurrency"] == 1
    # the verdict's view: each cell's state per objective
    states = cell_states(frame)
    assert states[(1, "short", 16, "ar")] == {"chat": "missed"}
    assert states[(1, "short", 4, "ddtree")] == {"chat": "undecided"}
    assert states[(1, "short", 1, "ddtree")] == {"chat": "met"}


def test_launches_pool_their_requests_and_the_interval_holds_the_spread_across_them():
    group = pd.DataFrame(
        {
            "requests_sent": [40, 40],
            "sessions": [40, 40],
            column("chat", "share"): [1.0, 0.9],
            column("chat", "met"): [40, 36],
            column("chat", "effective"): [40, 40],
            column("chat", "goodput"): [100.0, 80.0],
        }
    )
    out = combined_columns(group)
    assert out[column("chat", "met")] == 76 and out[column("chat", "share")] == pytest.approx(0.95)
    # two launches 0.1 apart: the Student-t interval, 0.95 +- 12.706 x 0.0707 / sqrt(2) clipped to [0, 1], is wider
    # than Wilson's at 40 requests
    assert (
        out[column("chat", "share_lo")] == pytest.approx(0.95 - 12.706 * 0.05)
        and out[column("chat", "share_hi")] == 1.0
    )
    assert out[column("chat", "goodput")] == 90.0 and out[column("chat", "goodput_lo")] < 80.0
    same = combined_columns(group.assign(**{column("chat", "share"): [1.0, 1.0], column("chat", "met"): [40, 40]}))
    assert same[column("chat", "share_lo")] == pytest.approx(40 / (40 + 1.959964**2))  # launches alike: Wilson's


def with_slo(section) -> dict:
    config = load_default_config()
    config["slo"] = section
    return config


def test_the_default_objectives_are_stated_and_judged():
    slo = checked(load_default_config())["slo"]
    assert slo["attainment"] == 0.9
    assert slo["objectives"] == [
        {"name": "interactive", "ttft_ms": 2000, "tpot_ms": 50},
        {"name": "fast", "ttft_ms": 1000, "tpot_ms": 10},
    ]
    parsed = Slo.from_config(slo)
    assert [o.text() for o in parsed.objectives] == [
        "TTFT <= 2000 ms, TPOT <= 50 ms",
        "TTFT <= 1000 ms, TPOT <= 10 ms",
    ]


@pytest.mark.parametrize(
    "section,message",
    [
        ({"objectives": [{"name": "chat"}]}, "slo.objectives[0] (chat): sets no target; give at least one of"),
        (
            {"objectives": [{"name": "a", "ttft_ms": 1}, {"name": "a", "tpot_ms": 2}]},
            "slo.objectives[1].name: 'a' is already the name of slo.objectives[0]",
        ),
        ({"objectives": [{"name": "a", "ttft_ms": 0}]}, "slo.objectives[0].ttft_ms: 0.0 is less than or equal to"),
        ({"objectives": [{"name": "a", "tpot_ms": "fast"}]}, "slo.objectives[0].tpot_ms: 'fast' is not of type"),
        ({"objectives": [{"name": "a", "ttft": 500}]}, "slo.objectives[0].ttft: not a key of slo.objectives[0]"),
        ({"objectives": [{"name": "a b", "itl_ms": 5}]}, "slo.objectives[0].name: 'a b' does not match"),
        ({"attainment": 1.5}, "slo.attainment: 1.5 is greater than the maximum of 1"),
        ({"attainment": 0}, "slo.attainment: 0.0 is less than or equal to the minimum of 0"),
        ({"attainment": 0.9, "target": 0.9}, "slo.target: not a key of slo; known: attainment, objectives"),
    ],
)
def test_a_bad_slo_is_refused_naming_its_key(section, message):
    with pytest.raises(cfg.ConfigError) as info:
        checked(with_slo(section))
    assert str(info.value).startswith(message), str(info.value)


def test_no_objective_is_allowed_and_judges_nothing():
    assert checked(with_slo({"objectives": []}))["slo"] == {"objectives": [], "attainment": 0.9}


def test_an_objective_written_out_as_the_default_is_the_default():
    # the aggregation job's params are the normalised block: writing the default out changes nothing it depends on
    config = load_default_config()
    config.pop("slo", None)
    default = checked(config)["slo"]
    written = {
        "objectives": [
            {"name": "interactive", "ttft_ms": 2000, "tpot_ms": 50},
            {"name": "fast", "ttft_ms": 1000.0, "tpot_ms": 10},
        ],
        "attainment": 0.9,
    }
    assert json.dumps(checked(with_slo(written))["slo"]) == json.dumps(default)


def test_the_report_section_tables_each_method_and_draws_only_what_is_not_all_met(tmp_path):
    from specsweep.report import Figures, Tables, slo_section

    slo = Slo((Objective("easy", ttft_ms=2000), Objective("hard", tpot_ms=10)), 0.9)
    rows = []
    for method, hard in (("ar", [0.99, 0.5, 0.2]), ("dflash", [1.0, 0.97, 0.96])):
        for c, share in zip((1, 4, 16), hard):
            lo, hi = (share - 0.05, min(1.0, share + 0.05)) if share < 1 else (0.943, 1.0)
            rows.append(
                {
                    "tp": 1,
                    "workload": "short",
                    "method": method,
                    "concurrency": c,
                    "output_throughput_per_gpu": 100.0 * c,
                    "simulated": True,
                    **{column("easy", k): v for k, v in (("share", 1.0), ("share_lo", 0.943), ("share_hi", 1.0))},
                    **{column("hard", k): v for k, v in (("share", share), ("share_lo", lo), ("share_hi", hi))},
                    column("easy", "goodput_per_gpu"): 100.0 * c,
                    column("hard", "goodput_per_gpu"): 100.0 * c * share,
                }
            )
    combined = judge(pd.DataFrame(rows), slo)
    capacity(combined, slo).to_csv(tmp_path / "slo.csv", index=False)
    empty = pd.DataFrame()
    data: dict = {}
    figs = Figures(data, ["ar", "dflash"])
    context = slo_section(Tables(combined, empty, empty, empty, empty), tmp_path, figs, data)
    assert [spec["id"] for spec in figs.specs] == ["slo-hard-short-tp1"]  # easy: every request met it
    assert context["slo_everyone"] == "\\texttt{easy} in short"
    assert context["slo_attainment"] == "90" and context["slo_least_sessions"] == 35
    shown = pd.read_csv(pd.io.common.StringIO(data["slo.csv"])).set_index(["slo", "method"])
    assert shown.loc[("hard", "ar"), "highest"] == "1"  # met at 1 (0.94 and up), missed at 4 and 16
    assert shown.loc[("hard", "ar"), "levels"] == "met at 1; missed at 4/\\allowbreak{}16"
    assert shown.loc[("hard", "dflash"), "highest"] == "$\\ge$16"  # met at every concurrency measured
    assert shown.loc[("easy", "ar"), "highest"] == "$\\ge$16"
    spec = figs.specs[0]
    assert [r["value"] for r in spec["reference"]] == [90.0]  # the attainment line, in percent
