"""Cells ``budget: verdict`` does not measure, because decided cells imply them, and the record each leaves.

Two rules, each applied by a server's bench job to its own cells (never to a cell ``remeasure`` names; never under
``budget: exhaustive``):

- implied slower (next_concurrency): a method decided slower than AR at concurrency c on a workload (its sequential
  interval below 1), where the cost model predicts it slower at every higher concurrency of that workload, is
  measured next at the workload's highest concurrency to confirm; when that cell is decided slower too, the cells
  between are "not measured: implied slower". When it is not, the cells between are measured as usual.
- dominated at the smallest TP (dominated): a setting of an algorithm (a DDTree budget, EAGLE's steps/topk, draft
  tokens) whose speedup interval lies wholly below another setting's of the same algorithm, at every concurrency of
  a workload at the configuration's smallest TP size, is not carried to the larger TP sizes on that workload: its
  cells there are "not measured: dominated at TP <n>". Their server waits for those cells (a DAG edge).

A cell not measured still gets its output: a small record (skipped_record) with the reason and the cells it was
implied from, never a number; the tables list it in results/skipped.csv, and the report in its own section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SKIPPED_SCHEMA = "specsweep-skipped-cell/1"
IMPLIED_SLOWER = "not measured: implied slower"
DOMINATED = "not measured: dominated at TP {tp}"
SKIPPED_COLUMNS = ["tp", "method", "workload", "concurrency", "reason", "implied_by", "simulated", "cell_file"]


def next_concurrency(
    levels: Sequence[int], decisions: Mapping[int, str], predicted: Mapping[int, float]
) -> tuple[int | None, dict[int, tuple[str, tuple[int, int]]]]:
    """(the next concurrency of a workload to measure, None when none is left; {concurrency: (why it is not measured,
    the two concurrencies it is implied from)}) from the ``decisions`` of its cells measured so far (sequential
    decisions: faster, slower, equivalent, undecided) and the cost model's ``predicted`` speedup at each
    concurrency. Ascending, except that the first cell decided slower below the top, with every higher concurrency
    predicted slower, sends the next measurement to the top, and a top decided slower too skips the cells between."""
    levels = sorted(levels)
    top, skipped = levels[-1], {}
    for c in levels[:-1]:
        if decisions.get(c) != "slower" or not all(predicted.get(x, 1.0) < 1 for x in levels if x > c):
            continue
        if top not in decisions:
            return top, {}
        if decisions[top] == "slower":
            why = f"{IMPLIED_SLOWER} (slower at concurrency {c} and {top}, predicted slower between)"
            skipped = {x: (why, (c, top)) for x in levels if c < x < top and x not in decisions}
        break
    rest = [x for x in levels if x not in decisions and x not in skipped]
    return (rest[0] if rest else None), skipped


def dominated(method: str, intervals: Mapping[str, Mapping[int, tuple]], levels: Sequence[int]) -> str | None:
    """The setting that dominates ``method`` on a workload (its name), or None: ``intervals`` {setting of the same
    algorithm: {concurrency: (speedup_lo, speedup_hi) of a cell measured, None where it has no interval; a cell
    not measured is absent}} at the smallest TP. Dominated where another setting's lower bound lies above this
    one's upper bound at every concurrency in ``levels`` where both have an interval, at least one, and this one
    has an interval wherever it was measured."""
    given = intervals.get(method) or {}
    mine = {c: v for c, v in given.items() if v is not None}
    if not mine or any(c in given and given[c] is None for c in levels):
        return None
    for other, theirs in sorted(intervals.items()):
        if other == method:
            continue
        both = [c for c in levels if c in mine and theirs.get(c) is not None]
        if both and all(theirs[c][0] > mine[c][1] for c in both):
            return other
    return None


SKIPPED_CELL = ("tp", "method", "workload", "concurrency", "repetition")  # a cell's identity, as cells have it


def skipped_record(cell: dict, reason: str, implied_by: Sequence[str], simulated: bool) -> dict:
    """What a cell not measured leaves as its output: its identity and key, why, the cells it was implied from."""
    return {
        "schema": SKIPPED_SCHEMA,
        "skipped": True,
        "simulated": simulated,
        "key": cell["key"],
        "cell": {k: cell[k] for k in SKIPPED_CELL},
        "reason": reason,
        "implied_by": list(implied_by),
    }


def is_skipped(cell: dict) -> bool:
    return cell.get("schema") == SKIPPED_SCHEMA


SKIPPED_FIELDS = frozenset(skipped_record({"key": "", **dict.fromkeys(SKIPPED_CELL)}, "", [], False))


def skipped_problem(record: dict) -> str | None:
    """Why a file that says it is a cell not measured is not a skipped_record (exactly its fields, a reason starting
    "not measured: ", at least one cell it is implied from), or None."""
    if set(record) != SKIPPED_FIELDS:
        return f"it says it is a cell not measured ({SKIPPED_SCHEMA}) but its fields are not a skipped record's"
    if not str(record["reason"]).startswith("not measured: ") or not record["implied_by"]:
        return "it says it is a cell not measured but gives no reason or no cell it is implied from"
    return None


def skipped_rows(records: Mapping[str, dict]) -> list[dict]:
    """One row per cell not measured ({cell file: skipped_record}), in SKIPPED_COLUMNS' order."""
    return [
        {
            **{k: r["cell"][k] for k in ("tp", "method", "workload", "concurrency")},
            "reason": r["reason"],
            "implied_by": "; ".join(r["implied_by"]),
            "simulated": r["simulated"],
            "cell_file": path,
        }
        for path, r in sorted(records.items())
    ]
