"""budget: verdict's implied cells (specsweep.implied): implied slower, dominated at the smallest TP, the skipped
list."""

from __future__ import annotations

import pytest

from specsweep import implied

LEVELS = [1, 2, 4, 8, 16]
SLOWER_ABOVE_2 = {1: 1.2, 2: 0.9, 4: 0.8, 8: 0.7, 16: 0.6}  # the cost model's predicted speedups


def walk(decide, predicted=SLOWER_ABOVE_2, levels=LEVELS):
    """Measure as a bench job does: ask for the next concurrency, 'measure' it (decide), until none is left."""
    decisions, order, skipped = {}, [], {}
    while True:
        nxt, skipped = implied.next_concurrency(levels, decisions, predicted)
        if nxt is None:
            return order, skipped
        order.append(nxt)
        decisions[nxt] = decide(nxt)


def test_a_cell_slower_with_slower_predicted_above_sends_the_next_measurement_to_the_top_and_skips_between():
    order, skipped = walk(lambda c: "faster" if c == 1 else "slower")
    assert order == [1, 2, 16]
    assert sorted(skipped) == [4, 8]
    why, basis = skipped[4]
    assert why.startswith(implied.IMPLIED_SLOWER) and basis == (2, 16)


def test_a_top_that_is_not_slower_measures_the_cells_between():
    order, skipped = walk(lambda c: "slower" if c == 2 else "equivalent")
    assert order == [1, 2, 16, 4, 8] and skipped == {}


def test_no_cell_is_implied_where_the_cost_model_predicts_faster_above():
    predicted = {**SLOWER_ABOVE_2, 8: 1.1}
    order, skipped = walk(lambda c: "slower", predicted)
    # slower everywhere, but 8 is predicted faster: only 8 (16 predicted slower above it) triggers, nothing between
    assert order == LEVELS and skipped == {}


def test_an_undecided_cell_implies_nothing():
    order, skipped = walk(lambda c: "undecided")
    assert order == LEVELS and skipped == {}


def test_a_setting_below_another_of_its_algorithm_at_every_concurrency_is_dominated():
    intervals = {
        "ddtree-b128": {1: (0.8, 0.9), 4: (0.7, 0.8)},
        "ddtree-b16": {1: (1.5, 1.7), 4: (1.2, 1.3)},
        "ddtree-b32": {1: (1.4, 1.6), 4: (0.75, 0.85)},  # overlaps b128 at 4, b16 at 1
    }
    assert implied.dominated("ddtree-b128", intervals, [1, 4]) == "ddtree-b16"
    assert implied.dominated("ddtree-b32", intervals, [1, 4]) is None
    assert implied.dominated("ddtree-b16", intervals, [1, 4]) is None


def test_a_setting_measured_without_an_interval_is_not_dominated_and_one_not_measured_is_left_out():
    intervals = {"a": {1: (0.8, 0.9), 4: None}, "b": {1: (1.5, 1.7), 4: (1.2, 1.3)}}
    assert implied.dominated("a", intervals, [1, 4]) is None
    del intervals["a"][4]  # not measured there (implied slower)
    assert implied.dominated("a", intervals, [1, 4]) == "b"


@pytest.mark.parametrize("simulated", [True, False])
def test_a_skipped_record_carries_no_number_and_lists_as_a_row(simulated):
    cell = {"tp": 1, "method": "ngram", "workload": "short", "concurrency": 8, "repetition": 0, "key": "k"}
    record = implied.skipped_record(cell, "not measured: implied slower", ["a.json", "b.json"], simulated)
    assert implied.is_skipped(record) and not implied.is_skipped({"cell": cell})
    assert not any(isinstance(v, float) for v in record.values())
    (row,) = implied.skipped_rows({"results/cells/tp1/ngram/short/c8.json": record})
    assert list(row) == implied.SKIPPED_COLUMNS
    assert row["implied_by"] == "a.json; b.json" and row["simulated"] is simulated
