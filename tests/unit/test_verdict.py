"""The verdict decided by intervals: a cell's state, the verdict table, break-even in words, findings, the stamp and its
caveats, on constructed cells and on the committed H200 records (dummy weights; acceptance forced)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from conftest import REPO
from specsweep import verdict
from specsweep.aggregate import pareto
from specsweep.metrics import MIN_SESSIONS

GPU = REPO / "benchmarks" / "gpu"


def cell(method, concurrency, speedup, lo=None, hi=None, workload="short", tp=1, **extra) -> dict:
    """A row of combined.csv: a method's cell with its speedup over AR and paired 95% interval (AR: speedup 1, no
    interval); throughput AR's (1000 tok/s) times the speedup."""
    algorithm = extra.pop("algorithm", "ar" if method == "ar" else "dflash")
    throughput = 1000.0 * speedup
    row = {
        "simulated": False,
        "tp": tp,
        "method": method,
        "algorithm": algorithm,
        "workload": workload,
        "concurrency": concurrency,
        "launches": 1,
        "requests_sent": 32,
        "requests_failed": 0,
        "output_throughput": throughput,
        "output_throughput_lo": throughput * 0.95,
        "output_throughput_hi": throughput * 1.05,
        "output_throughput_per_gpu": throughput / tp,
        "speedup": speedup,
        "speedup_lo": math.nan if lo is None else lo,
        "speedup_hi": math.nan if hi is None else hi,
        "speedup_pairs": 32,
        "tpot_p50": 0.01 / speedup,
        "ttft_p99": 0.05,
        "acceptance_length": math.nan if method == "ar" else 2.0,
        "acceptance_disagree": False,
        "load_format": "auto",
        "content_mix": "chat 100%",
        "final": True,
    }
    row.update(extra)
    return row


def frame(*rows) -> pd.DataFrame:
    """combined.csv of these cells, AR's cell beside each (TP, workload, concurrency) they cover."""
    keys = {(r["tp"], r["workload"], r["concurrency"]) for r in rows}
    ar = [cell("ar", c, 1.0, workload=w, tp=tp) for tp, w, c in sorted(keys)]
    return pd.DataFrame(ar + list(rows))


def test_a_cell_is_faster_slower_or_inconclusive_by_its_interval_alone():
    assert verdict.state(1.01, 1.4) == verdict.FASTER
    assert verdict.state(0.6, 0.99) == verdict.SLOWER
    for lo, hi in ((0.9, 1.1), (1.0, 1.3), (0.7, 1.0), (None, None), (math.nan, 2.0), (1.2, math.inf)):
        assert verdict.state(lo, hi) == verdict.INCONCLUSIVE, (lo, hi)


def test_the_verdict_table_picks_the_fastest_method_and_deploys_only_what_its_interval_decides():
    table = verdict.verdict_table(
        frame(
            # concurrency 1: the fastest is decided faster
            cell("a", 1, 2.0, 1.8, 2.2),
            cell("b", 1, 1.5, 1.4, 1.6),
            # 4: the fastest is inconclusive, a slower one is decided faster: deploy the decided one
            cell("a", 4, 1.3, 0.8, 1.9),
            cell("b", 4, 1.1, 1.05, 1.15),
            # 16: even the fastest is slower: deploy AR
            cell("a", 16, 0.8, 0.7, 0.9),
            cell("b", 16, 0.6, 0.5, 0.7),
            # 64: the fastest's interval contains 1, nothing else is faster
            cell("a", 64, 1.05, 0.9, 1.2),
            cell("b", 64, 0.5, 0.4, 0.6),
        )
    ).set_index("concurrency")
    assert list(table["best"]) == ["a", "a", "a", "a"]  # the highest output throughput, whatever its interval
    assert list(table["verdict"]) == ["faster", "inconclusive", "slower", "inconclusive"]
    assert list(table["deploy"]) == ["a", "b", "ar", verdict.UNDECIDED]
    assert table.loc[1, "speedup"] == 2.0 and (table.loc[1, "speedup_lo"], table.loc[1, "speedup_hi"]) == (1.8, 2.2)
    assert table.loc[1, "output_throughput_per_gpu"] == 2000.0 and table.loc[1, "ar_output_throughput_per_gpu"] == 1000
    assert (table["methods_compared"] == 2).all() and (table["reason"] == "").all()


def test_a_cell_without_an_interval_is_inconclusive_and_says_why():
    few = MIN_SESSIONS - 2
    rows = frame(cell("a", 1, 3.0, speedup_pairs=few), cell("a", 4, 2.0, launches=3))
    rows = pd.concat([rows, pd.DataFrame([cell("a", 16, 2.0)])])  # no AR cell at 16
    states = verdict.cell_states(rows).set_index("concurrency")
    assert (states["verdict"] == verdict.INCONCLUSIVE).all()
    assert states.loc[1, "reason"] == f"no interval: {few} sessions shared with AR, fewer than {MIN_SESSIONS}"
    assert "3 launches" in states.loc[4, "reason"]
    assert "no AR cell" in states.loc[16, "reason"]
    table = verdict.verdict_table(rows).set_index("concurrency")
    assert table.loc[1, "verdict"] == verdict.INCONCLUSIVE and table.loc[1, "deploy"] == verdict.UNDECIDED
    line = verdict.confidence_line(rows)
    assert "3 of 3 speculative cells have no interval (" in line
    assert all(states.loc[c, "reason"].removeprefix("no interval: ") in line for c in (1, 4, 16))


@pytest.mark.parametrize(
    "states, words",
    [
        ("fff", "faster at every concurrency measured"),
        ("sss", "never faster"),
        ("ffs", "faster up to 4; slower from 16"),
        ("fii", "faster up to 1; inconclusive from 4"),
        ("iii", "inconclusive from 1"),
        ("fis", "faster up to 1; inconclusive at 4; slower from 16"),
        ("sif", "slower up to 1; inconclusive at 4; faster again at 16"),
    ],
)
def test_break_even_in_words_follows_the_states_across_concurrencies(states, words):
    name = {"f": verdict.FASTER, "s": verdict.SLOWER, "i": verdict.INCONCLUSIVE}
    assert verdict.break_even_words([1, 4, 16], [name[s] for s in states]) == words


def test_break_even_never_reads_a_number_for_a_method_that_never_beat_ar_nor_past_an_inconclusive_cell():
    """The issue's two cases: a method slower everywhere (break-even read "1", like good news), and one at 0.52x
    (CI 0.28-1.67) at concurrency 16 (given break-even 64)."""
    table = verdict.break_even(
        frame(
            cell("never", 1, 0.7, 0.6, 0.8),
            cell("never", 4, 0.6, 0.5, 0.7),
            cell("never", 16, 0.5, 0.4, 0.6),
            cell("never", 64, 0.4, 0.3, 0.5),
            cell("open", 1, 4.2, 4.0, 4.4),
            cell("open", 4, 1.5, 1.06, 2.56),
            cell("open", 16, 0.52, 0.28, 1.67),
            cell("open", 64, 0.38, 0.29, 0.56),
            cell("upto", 1, 2.0, 1.8, 2.2),
            cell("upto", 4, 1.5, 1.2, 1.8),
            cell("upto", 16, 0.8, 0.7, 0.9),
            cell("upto", 64, 0.6, 0.5, 0.7),
            cell("always", 1, 2.0, 1.8, 2.2),
            cell("always", 4, 1.5, 1.2, 1.8),
            cell("always", 16, 1.2, 1.1, 1.3),
            cell("always", 64, 1.1, 1.01, 1.2),
        )
    ).set_index("method")
    assert table.loc["never", "break_even"] == "never faster" and pd.isna(table.loc["never", "faster_up_to"])
    assert table.loc["never", "first_slower"] == 1
    assert table.loc["open", "break_even"] == "faster up to 4; inconclusive at 16; slower from 64"
    assert table.loc["open", "states"] == "1 faster; 4 faster; 16 inconclusive; 64 slower"
    assert (table.loc["open", "faster_up_to"], table.loc["open", "first_inconclusive"]) == (4, 16)
    assert table.loc["open", "first_slower"] == 64
    assert table.loc["upto", "break_even"] == "faster up to 4; slower from 16"
    assert table.loc["always", "break_even"] == "faster at every concurrency measured"
    assert table.loc["always", "faster_up_to"] == 64 and pd.isna(table.loc["always", "first_slower"])
    assert (table.loc["open", "speedup_at_highest"], table.loc["open", "speedup_at_highest_hi"]) == (0.38, 0.56)
    assert "break_even_concurrency" not in table  # the number that read like good news is gone


def test_break_even_reads_only_concurrencies_compared_with_ar():
    rows = frame(cell("a", 1, 2.0, 1.8, 2.2), cell("a", 4, 1.5, 1.2, 1.8))
    rows = pd.concat([rows, pd.DataFrame([cell("a", 16, 0.5, 0.4, 0.6)])])  # no AR at 16
    row = verdict.break_even(rows).iloc[0]
    assert row["break_even"] == "faster at every concurrency measured" and row["highest_concurrency_tested"] == 4


def test_findings_carry_the_numbers_and_intervals_of_the_cells_they_name():
    rows = frame(
        cell("a", 1, 2.5, 2.2, 2.8),
        cell("a", 4, 1.3, 1.1, 1.5),
        cell("a", 16, 0.7, 0.6, 0.8),
        cell("b", 1, 1.2, 1.1, 1.3),
        cell("b", 4, 1.4, 0.9, 2.1),
        cell("b", 16, 0.5, 0.4, 0.6),
    )
    found = verdict.findings(rows, verdict.verdict_table(rows), verdict.break_even(rows))
    assert 3 <= len(found) <= 5
    assert found[0] == "Largest decided speedup: a on short, concurrency 1, 2.50x (95% CI 2.20-2.80)."
    assert any("a, the fastest on short at concurrency 1, is faster up to 4; slower from 16" in f for f in found)
    assert any("1 of 6 speculative cells are inconclusive" in f and "1.40x (95% CI 0.90-2.10)" in f for f in found)
    assert any(f.startswith("Even the fastest speculative method is slower than AR in 1 of 3 cells") for f in found)


def record(name: str) -> tuple[pd.DataFrame, dict]:
    folder = GPU / name
    return pd.read_csv(folder / "summary.csv"), json.loads((folder / "environment.json").read_text())


def test_the_stamp_of_the_dummy_weight_h200_record_says_why_ngram_accepts_and_the_drafters_do_not():
    summary, environment = record("spec-2026-12-01")
    stamp = verdict.stamp(summary, environment, "Qwen3-8B", list(summary["finished_at"]), pareto=pareto(summary))
    assert stamp["flags"] == ["DUMMY WEIGHTS"]
    gpus = environment["hardware"]["gpus"]
    assert f"{len(gpus)} x {gpus[0]['name']}" in stamp["text"]
    assert f"sglang {environment['server']['version']}" in stamp["text"] and "wheel sha256" in stamp["text"]
    assert "weights dummy" in stamp["text"] and summary["finished_at"].min()[:10] in stamp["text"]
    caveat = next(c for c in stamp["caveats"] if c.startswith("Dummy weights"))
    ngram = summary[summary["algorithm"] == "ngram"].groupby("method")["acceptance_length"].max()
    assert len(ngram) == 2 and (ngram > verdict.ARTEFACT_ACCEPTANCE).all()
    for method, acceptance in ngram.items():  # each NGRAM method named with its measured acceptance
        assert f"{method} (NGRAM) {acceptance:.2f}" in caveat
    assert "falls into a loop of a few tokens" in caveat and "n-gram lookup drafts that loop" in caveat
    drafters = summary[summary["algorithm"].isin(["dflash", "eagle3", "standalone"])]["acceptance_length"]
    assert drafters.max() <= verdict.ARTEFACT_ACCEPTANCE
    assert "A random drafter predicts nothing: DFlash, EAGLE-3, standalone drafter accept" in caveat
    assert f"accept {drafters.min():.2f} tokens" in caveat or f"accept {drafters.min():.2f}-" in caveat
    assert any("Pareto frontiers" in c and "ngram-d32" in c for c in stamp["caveats"])
    # the verdict table marks the artefact its best method rests on
    table = verdict.verdict_table(summary)
    assert (table["best"] == "ngram-d32").all() and table["artefact"].all()


def test_the_caveat_follows_the_data_not_the_flag():
    """The same dummy-weight record with NGRAM accepting about 1 (as a real model's text rarely repeats): no
    artefact is named; its stamp still says dummy weights."""
    summary, environment = record("spec-2026-12-01")
    summary.loc[summary["algorithm"] == "ngram", "acceptance_length"] = 1.02
    caveat = verdict.dummy_weights_caveat(summary)
    assert "loop" not in caveat and "artefact" not in caveat and "NGRAM" in caveat
    assert not verdict.verdict_table(summary)["artefact"].any()
    assert verdict.stamp(summary, environment, "Qwen3-8B")["flags"] == ["DUMMY WEIGHTS"]


def test_acceptance_forced_on_the_server_is_stamped_with_each_method_and_its_value():
    summary, environment = record("forced-2026-12-02")
    stamp = verdict.stamp(summary, environment, "Qwen3-8B")
    assert stamp["flags"] == ["DUMMY WEIGHTS", "ACCEPTANCE FORCED"]
    forced = summary.dropna(subset=["accept_length"]).groupby("method")["accept_length"].first()
    assert len(forced) == 6
    caveat = next(c for c in stamp["caveats"] if c.startswith("Acceptance forced"))
    assert all(f"{m} ({a:g})" in caveat for m, a in forced.items()) and "SGLANG_SIMULATE_ACC_LEN" in caveat
    assert verdict.verdict_table(summary)["artefact"].all()  # every best method's acceptance was forced


def test_a_simulated_run_is_stamped_simulated_and_a_measured_one_measured():
    rows = frame(cell("a", 1, 2.0, 1.8, 2.2))
    assert verdict.stamp(rows, {"hardware": {"gpus": []}}, "m")["flags"] == ["MEASURED"]
    simulated = verdict.stamp(rows.assign(simulated=True), {}, "m", sim_profile="qwen3-8b on H200")
    assert simulated["flags"] == ["SIMULATED"] and "qwen3-8b on H200" in simulated["text"]
    assert simulated["caveats"][0].startswith("Warning: simulated results.")


def test_a_run_comparing_engines_is_stamped_with_each_engine_not_only_the_reference():
    builds = pd.DataFrame(
        [
            {"item": "sglang", "release": "0.5.16", "fork": "0.0.0.dev1+ddtree", "differs": True},
            {"item": "torch", "release": "2.11.0", "fork": "2.11.0", "differs": False},
            {
                "item": "commit or wheel",
                "release": "sha256=b8ed16e72c7d6a64",
                "fork": "433c58ed70cd1dabe5a0",
                "differs": True,
            },
        ]
    )
    named = verdict.engines_text(builds)
    assert named == (
        "engines release (sglang 0.5.16, wheel sha256 b8ed16e72c7d) and "
        "fork (sglang 0.0.0.dev1+ddtree, commit 433c58ed70cd)"
    )
    rows = frame(cell("a", 1, 2.0, 1.8, 2.2))
    environment = {"hardware": {"gpus": [{"name": "H200"}]}, "server": {"name": "sglang", "version": "0.5.16"}}
    assert named in verdict.stamp(rows, environment, "m", engines=named)["text"]
    assert "0.5.16 (release; no commit recorded)" in verdict.stamp(rows, environment, "m")["text"]  # one engine
    assert verdict.engines_text(builds[["item", "release", "differs"]]) == ""


def test_the_confidence_line_says_when_launches_disagree_beyond_their_intervals():
    rows = frame(cell("a", 1, 2.0, 1.8, 2.2, launches=2))
    launches = pd.DataFrame(
        [
            {**cell("a", 1, 2.0), "output_throughput_lo": lo, "output_throughput_hi": hi}
            for lo, hi in ((1900, 2100), (2200, 2400))
        ]
    )
    line = verdict.confidence_line(rows, launches)
    assert "in 1 of 1 repeated cells the launches' 95% throughput intervals do not overlap" in line
    launches.loc[1, "output_throughput_lo"] = 2000
    assert "launch-to-launch variation inside the intervals" in verdict.confidence_line(rows, launches)
    failed = rows.assign(requests_failed=[0, 3])
    assert f"3 of {int(failed['requests_sent'].sum()):,} requests failed in 1 cells" in verdict.confidence_line(failed)


def test_the_workload_line_counts_what_ran_not_what_was_configured():
    rows = frame(cell("a", 1, 2.0, 1.8, 2.2, sessions=128))
    requests = pd.DataFrame(
        [
            {
                "tp": 1,
                "method": m,
                "workload": "short",
                "concurrency": 1,
                "repetition": 0,
                "session": f"s{i}",
                "error": None,
                "prompt_tokens": 100 + i,
                "output_tokens": 64,
            }
            for m in ("ar", "a")
            for i in range(16)
        ]
    )
    (line,) = verdict.workload_lines(rows, requests, "temperature 0 (greedy) only")
    assert line == (
        "short: input mean 108 tokens (100-115), output 64 tokens in every request; content chat 100%; "
        "temperature 0 (greedy) only; 16 sessions per cell; 1 launch per cell."
    )


def test_with_two_engines_ar_is_the_best_methods_own_engines():
    rows = pd.DataFrame(
        [
            cell("ar@old", 1, 1.0, engine="old", algorithm="ar"),
            cell("ar@new", 1, 1.0, engine="new", algorithm="ar", output_throughput_per_gpu=1500.0),
            cell("d@old", 1, 0.5, 0.4, 0.6, engine="old"),
            cell("d@new", 1, 0.9, 0.8, 0.95, engine="new"),
        ]
    )
    row = verdict.verdict_table(rows).iloc[0]
    assert (row["best"], row["verdict"], row["deploy"], row["ar_output_throughput_per_gpu"]) == (
        "d@new",
        "slower",
        "ar@new",
        1500.0,
    )


def test_a_plan_of_ar_alone_has_no_verdict_and_no_error():
    rows = pd.DataFrame([cell("ar", 1, 1.0), cell("ar", 4, 1.0)])
    assert verdict.verdict_table(rows).empty and verdict.break_even(rows).empty
    assert verdict.findings(rows, verdict.verdict_table(rows), verdict.break_even(rows)) == []
    assert verdict.heatmap_panels(rows) == []
    assert list(verdict.break_even(rows).columns) == verdict.BREAK_EVEN_COLUMNS
    assert "no request failed" in verdict.confidence_line(rows)


def test_the_verdict_table_says_which_slos_its_best_method_meets():
    rows = frame(
        cell("a", 1, 2.0, 1.8, 2.2, slo_chat_state="met", slo_batch_state="undecided"),
        cell("b", 1, 1.5, 1.4, 1.6, slo_chat_state="missed", slo_batch_state="missed"),
    )
    assert verdict.verdict_table(rows).iloc[0]["slo"] == "chat met; batch undecided"
    assert verdict.verdict_table(frame(cell("a", 1, 2.0, 1.8, 2.2))).iloc[0]["slo"] == ""


def forced(method, length, concurrency, speedup, lo=None, hi=None, mode="chain", **extra) -> dict:
    """A cell of an EAGLE-3 method whose acceptance was forced to ``length`` (its name tagged -a<length>)."""
    shape = {"chain": {"num_steps": 3, "topk": 1, "verify_width": 4}, "tree": {"num_steps": 4, "topk": 4}}[mode]
    return cell(
        f"{method}-a{length:g}",
        concurrency,
        speedup,
        lo,
        hi,
        algorithm="eagle3",
        accept_length=float(length),
        tree_mode=mode,
        engine="",
        **shape,
        **extra,
    )


def test_break_even_acceptance_interpolates_the_speedup_and_its_interval_between_the_bracketing_lengths():
    """Speedups 0.8, 1.2, 1.6 at forced 2, 3, 4 cross 1 halfway between 2 and 3; the interval's ends are where the
    upper bounds (0.85 -> 1.3) and the lower bounds (0.75 -> 1.1) cross 1 on the same lines. A tree family at the
    same cell, and a method not forced, are kept apart."""
    rows = frame(
        forced("chain", 2, 16, 0.8, 0.75, 0.85),
        forced("chain", 3, 16, 1.2, 1.1, 1.3),
        forced("chain", 4, 16, 1.6, 1.5, 1.7),
        forced("tree", 2, 16, 0.5, 0.4, 0.6, mode="tree"),
        forced("tree", 4, 16, 1.1, 0.9, 1.3, mode="tree"),
        cell("dflash", 16, 1.5, 1.4, 1.6),
    )
    table = verdict.acceptance_break_even(rows).set_index("family")
    assert sorted(table.index) == ["chain", "tree"]
    chain = table.loc["chain"]
    assert chain["outcome"] == verdict.INTERPOLATED and chain["forced_lengths"] == "2; 3; 4"
    assert chain["break_even_acceptance"] == pytest.approx(2.5)
    assert chain["break_even_acceptance_lo"] == pytest.approx(2 + 0.15 / 0.45)
    assert chain["break_even_acceptance_hi"] == pytest.approx(2 + 0.25 / 0.35)
    assert chain["break_even"] == "2.50 (95% CI about 2.33 to 2.71)"
    # the tree: 0.5 -> 1.1 over 2 -> 4 crosses at 2 + 2 * 0.5 / 0.6; its lower bound never reaches 1 (> 4)
    tree = table.loc["tree"]
    assert tree["break_even_acceptance"] == pytest.approx(2 + 2 * 0.5 / 0.6)
    assert tree["break_even_acceptance_lo"] == pytest.approx(2 + 2 * 0.4 / 0.7)
    assert math.isnan(tree["break_even_acceptance_hi"]) and tree["break_even"].endswith("to >4)")


@pytest.mark.parametrize(
    ("cells", "outcome", "words"),
    [
        # faster than AR already at the lowest forced length
        ([(2, 1.2, 1.1, 1.3), (3, 1.5, 1.4, 1.6)], verdict.BELOW, "below 2"),
        # slower than AR even at the highest
        ([(2, 0.5, 0.4, 0.6), (4, 0.9, 0.85, 0.95)], verdict.ABOVE, "above 4"),
        # inconclusive at both ends: the interval spans every forced length
        ([(2, 0.95, 0.8, 1.1), (4, 1.05, 0.9, 1.2)], verdict.NOT_DECIDED, "not decided"),
        # a cell without an interval
        (
            [(2, 0.8, None, None), (4, 1.5, 1.4, 1.6)],
            verdict.NOT_DECIDED,
            "not decided (a cell without a speedup interval)",
        ),
    ],
)
def test_break_even_acceptance_outside_the_forced_lengths_or_left_open_by_the_intervals_is_said(cells, outcome, words):
    rows = frame(*(forced("chain", n, 4, s, lo, hi) for n, s, lo, hi in cells))
    (row,) = verdict.acceptance_break_even(rows).to_dict("records")
    assert (row["outcome"], row["break_even"]) == (outcome, words)
    assert math.isnan(row["break_even_acceptance"])


def test_break_even_acceptance_is_the_last_rise_through_one_and_a_family_is_its_name_less_the_forced_tag():
    # noisy speedups that dip below 1 again: the method pays at every higher length only from the last rise
    assert verdict.crossing([2.0, 3.0, 4.0], [1.05, 0.95, 1.3]) == pytest.approx(3 + 0.05 / 0.35)
    assert verdict.crossing([2.0, 3.0], [1.0, 1.2], at_one_counts=True) == pytest.approx(2.0)
    assert verdict.family_name("eagle3-chain-a2.5@fork", 2.5) == "eagle3-chain@fork"
    assert verdict.family_name("eagle3-a3-s4", 3.0) == "eagle3-s4"
    assert verdict.family_name("eagle3-a30", 3.0) == "eagle3-a30"  # not its tag: a single forced length's name
    # no forced method, or no AR to compare with: no row
    assert verdict.acceptance_break_even(frame(cell("dflash", 1, 1.5, 1.4, 1.6))).empty
    no_ar = pd.DataFrame([forced("chain", 2, 1, math.nan), forced("chain", 3, 1, math.nan)])
    assert verdict.acceptance_break_even(no_ar).empty


def test_break_even_acceptance_on_the_forced_h200_record_agrees_with_its_readme():
    """The record's README: the EAGLE-3 chain pays from acceptance 3 up to 16 requests and needs about 4 at 64; the
    tree needs more than the chain at every concurrency, and more than 4 at 64."""
    summary, _ = record("forced-2026-12-02")
    table = verdict.acceptance_break_even(summary)
    assert not table["simulated"].any() and set(table["forced_lengths"]) == {"2; 3; 4"}
    chain = table[table["family"] == "eagle3-chain"].set_index("concurrency")
    tree = table[table["family"] == "eagle3-tree"].set_index("concurrency")
    assert list(chain.index) == list(tree.index) == [1, 4, 16, 64]
    assert list(chain["outcome"]) == [verdict.BELOW, verdict.BELOW, verdict.INTERPOLATED, verdict.INTERPOLATED]
    assert 2 < chain.loc[16, "break_even_acceptance"] < 3 and 3.5 < chain.loc[64, "break_even_acceptance"] < 4
    for c in (16, 64):  # the estimate lies within its interval
        lo, hi = chain.loc[c, ["break_even_acceptance_lo", "break_even_acceptance_hi"]]
        assert lo < chain.loc[c, "break_even_acceptance"] and not hi < chain.loc[c, "break_even_acceptance"]
    assert tree.loc[64, "outcome"] == verdict.ABOVE
    for c in (4, 16):
        assert tree.loc[c, "break_even_acceptance"] > (
            2 if chain.loc[c, "outcome"] == verdict.BELOW else chain.loc[c, "break_even_acceptance"]
        )


def test_break_even_acceptance_on_the_forced_moe_record_agrees_with_its_readme():
    """The MoE record's README: at acceptance 3 the chain still pays up to 16 requests (1.13x), so its break-even
    there lies below 3; at 1 request it pays already at acceptance 2 (1.11x)."""
    summary, _ = record("forced-moe-2026-12-02")
    chain = verdict.acceptance_break_even(summary).set_index(["family", "concurrency"]).loc["eagle3-chain"]
    assert chain.loc[1, "outcome"] == verdict.BELOW
    assert chain.loc[16, "outcome"] == verdict.INTERPOLATED and 2 < chain.loc[16, "break_even_acceptance"] < 3
