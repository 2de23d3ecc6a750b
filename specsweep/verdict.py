"""The verdict: which method to deploy at each (TP, workload, concurrency), by how much and how sure.

Every decision is read from a cell's paired 95% speedup interval against AR (combined.csv: speedup, speedup_lo,
speedup_hi; metrics.speedup within one launch, a Student-t interval across launches where a cell was repeated):

- faster: the interval lies above 1 (speedup_lo > 1);
- slower: the interval lies below 1 (speedup_hi < 1);
- inconclusive: the interval contains 1, or there is no interval (fewer than MIN_SESSIONS sessions shared with AR,
  launches that did not give two different speedups, no AR cell): the reason is said.

From those states: the verdict table (the best speculative method per cell and what to deploy there), break-even in
words per (TP, method, workload), break-even acceptance (where acceptance was forced: the acceptance at which a
family of forced methods pays, interpolated between its forced lengths), findings, the stamp (measured or
SIMULATED / DUMMY WEIGHTS / ACCEPTANCE FORCED) with caveats written from the data, and the workload and confidence
lines. Pure pandas: the report typesets what this module returns (plain text; no LaTeX, no Snakemake).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import pandas as pd

from . import algorithms
from .metrics import MIN_SESSIONS

FASTER, SLOWER, INCONCLUSIVE = "faster", "slower", "inconclusive"
UNDECIDED = "undecided"  # what to deploy where the best method's interval contains 1
# With dummy weights, a method whose acceptance length (tokens a verify round commits, metrics.acceptance_length) is
# above this is an artefact: a drafter with random weights predicts nothing and accepts about 1.
ARTEFACT_ACCEPTANCE = 1.5
DISAGREE_TOLERANCE = 0.02  # acceptance estimates agree within this relative difference (metrics.acceptance_agreement)


def _number(value) -> float | None:
    """A finite float, or None for NaN, None and infinities."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def state(lo, hi) -> str:
    """A cell's state against AR from its 95% speedup interval [lo, hi]: faster where lo > 1, slower where hi < 1,
    inconclusive where the interval contains 1 or is missing."""
    lo, hi = _number(lo), _number(hi)
    if lo is None or hi is None:
        return INCONCLUSIVE
    return FASTER if lo > 1 else SLOWER if hi < 1 else INCONCLUSIVE


def no_interval_reason(row: pd.Series | dict, has_ar: bool = True) -> str:
    """Why a speculative cell has no speedup interval ("" where it has one): no AR cell to compare with, no session
    completed in both cells, fewer than MIN_SESSIONS sessions shared with AR, or a combined cell whose launches did
    not give two speedups that differ."""
    if _number(row.get("speedup_lo")) is not None and _number(row.get("speedup_hi")) is not None:
        return ""
    if not has_ar:
        return "no interval: no AR cell at this TP, workload and concurrency"
    if _number(row.get("speedup")) is None:
        return "no interval: no session completed in both this cell and AR's"
    launches = _number(row.get("launches")) or 1
    if launches > 1:
        return f"no interval: the {launches:.0f} launches did not give two different speedups"
    pairs = _number(row.get("speedup_pairs")) or 0
    if pairs < MIN_SESSIONS:
        return f"no interval: {pairs:.0f} sessions shared with AR, fewer than {MIN_SESSIONS}"
    return "no interval: the bootstrap gave none"


def _ar_keys(frame: pd.DataFrame) -> set:
    ar = frame[frame["algorithm"] == algorithms.BASELINE]
    return set(zip(ar["tp"], ar["workload"], ar["concurrency"]))


def cell_states(frame: pd.DataFrame) -> pd.DataFrame:
    """The speculative rows of combined.csv (one per cell) with ``verdict`` (state of the paired 95% speedup interval)
    and ``reason`` (why there is no interval; "" where there is one)."""
    spec = frame[frame["algorithm"] != algorithms.BASELINE].copy()
    ar = _ar_keys(frame)
    has_ar = [(r.tp, r.workload, r.concurrency) in ar for r in spec.itertuples()]
    spec["verdict"] = [state(lo, hi) for lo, hi in zip(spec["speedup_lo"], spec["speedup_hi"])]
    spec["reason"] = [no_interval_reason(row, a) for (_, row), a in zip(spec.iterrows(), has_ar)]
    return spec


def acceptance_artefact(frame: pd.DataFrame) -> pd.Series:
    """Per row: whether its acceptance is an artefact: forced on the server (``accept_length`` set,
    SGLANG_SIMULATE_ACC_LEN), or measured above ARTEFACT_ACCEPTANCE on dummy (random) weights."""
    forced = frame["accept_length"].notna() if "accept_length" in frame else pd.Series(False, index=frame.index)
    dummy = frame["load_format"].eq("dummy") if "load_format" in frame else pd.Series(False, index=frame.index)
    measured = frame["acceptance_length"] if "acceptance_length" in frame else pd.Series(math.nan, index=frame.index)
    high = pd.to_numeric(measured, errors="coerce").fillna(0) > ARTEFACT_ACCEPTANCE
    return (forced | (dummy & high)).astype(bool)


VERDICT_COLUMNS = [
    "tp",
    "workload",
    "concurrency",
    "best",
    "algorithm",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "verdict",
    "reason",
    "deploy",
    "output_throughput_per_gpu",
    "ar_output_throughput_per_gpu",
    "tpot_p50",
    "ttft_p99",
    "acceptance_length",
    "artefact",
    "methods_compared",
    "slo",
]


def verdict_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (TP, workload, concurrency) of combined.csv: the best method, the speculative method with the highest
    output throughput there (point estimate), its speedup over AR with the paired 95% interval, its verdict, and what
    to deploy: the best method where it is faster; AR where even it is slower; where it is inconclusive, the fastest
    method decided faster if there is one, else "undecided". Beside them the best method's throughput per GPU (and
    AR's), TPOT p50 and TTFT p99 (s), acceptance length, whether its acceptance is an artefact, how many
    speculative methods were compared, and each SLO's state for the best method (slo_states)."""
    spec = cell_states(frame).dropna(subset=["output_throughput"])
    if spec.empty:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    spec = spec.assign(artefact=acceptance_artefact(spec))
    ar = frame[frame["algorithm"] == algorithms.BASELINE]
    rows = []
    for key, group in spec.groupby(["tp", "workload", "concurrency"], sort=True):
        best = _top(group, "output_throughput")
        at = ar[(ar["tp"] == key[0]) & (ar["workload"] == key[1]) & (ar["concurrency"] == key[2])]
        if "engine" in at and len(at) > 1:  # several engines: AR on the best method's engine, its speedup's base
            at = at[at["engine"].fillna("") == ("" if pd.isna(best.get("engine")) else best["engine"])]
        base = at.iloc[0] if len(at) else None
        rows.append(
            {
                "tp": key[0],
                "workload": key[1],
                "concurrency": key[2],
                "best": best["method"],
                **{c: best[c] for c in ("algorithm", "speedup", "speedup_lo", "speedup_hi", "verdict", "reason")},
                "deploy": _deploy(best, group, None if base is None else base["method"]),
                "output_throughput_per_gpu": best["output_throughput_per_gpu"],
                "ar_output_throughput_per_gpu": None if base is None else base["output_throughput_per_gpu"],
                **{c: best.get(c) for c in ("tpot_p50", "ttft_p99", "acceptance_length", "artefact")},
                "methods_compared": len(group),
                "slo": slo_states(best),
            }
        )
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def slo_states(row: pd.Series) -> str:
    """Each configured SLO's state in a cell (the summary's slo_<name>_state: met, undecided or missed; slo.py), as
    "interactive met; batch missed"; "" where no SLO is configured."""
    names = [c[len("slo_") : -len("_state")] for c in row.index if c.startswith("slo_") and c.endswith("_state")]
    return "; ".join(f"{name} {row[f'slo_{name}_state']}" for name in names if pd.notna(row[f"slo_{name}_state"]))


def _deploy(best: pd.Series, group: pd.DataFrame, ar_method: str | None) -> str:
    """What to deploy at one cell (see verdict_table)."""
    if best["verdict"] == FASTER:
        return str(best["method"])
    if best["verdict"] == SLOWER and ar_method is not None:
        return str(ar_method)
    faster = group[group["verdict"] == FASTER]
    if len(faster):  # the best's interval contains 1 while a slower-measured method's lies above 1
        return str(_top(faster, "output_throughput")["method"])
    return UNDECIDED


BREAK_EVEN_COLUMNS = [
    "tp",
    "method",
    "workload",
    "break_even",
    "states",
    "faster_up_to",
    "first_inconclusive",
    "first_slower",
    "highest_concurrency_tested",
    "speedup_at_highest",
    "speedup_at_highest_lo",
    "speedup_at_highest_hi",
]


def break_even_words(concurrencies: Sequence[int], states: Sequence[str]) -> str:
    """Break-even in words from a method's states at the concurrencies measured (ascending), read as runs of one
    state: "faster at every concurrency measured" (faster at each); "never faster" (slower at each); otherwise each
    run in order: a first run of faster "faster up to c" (c its highest concurrency), a run of slower or inconclusive
    that reaches the highest concurrency "slower from c" / "inconclusive from c" (c its lowest), one in between
    "slower at c" / "inconclusive at c" (c, or "c1-c2" for several), a later run of faster "faster again at c";
    runs joined by "; " (e.g. "faster up to 4; inconclusive from 16")."""
    if not states:
        return ""
    runs: list[list] = []
    for c, s in zip(concurrencies, states):
        if runs and runs[-1][0] == s:
            runs[-1][2] = c
        else:
            runs.append([s, c, c])
    if len(runs) == 1 and runs[0][0] == FASTER:
        return "faster at every concurrency measured"
    if len(runs) == 1 and runs[0][0] == SLOWER:
        return "never faster"
    words = []
    for i, (s, first, last) in enumerate(runs):
        span = f"{first}" if first == last else f"{first}-{last}"
        if s == FASTER:
            words.append(f"faster up to {last}" if i == 0 else f"faster again at {span}")
        elif i == len(runs) - 1:
            words.append(f"{s} from {first}")
        else:
            words.append(f"{s} up to {last}" if i == 0 else f"{s} at {span}")
    return "; ".join(words)


def break_even(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (TP, method, workload) of combined.csv, over the concurrencies where AR was measured too: break-even in
    words (break_even_words of the states decided by the paired 95% speedup intervals), each concurrency's state
    ("1 faster; 4 inconclusive"), the highest concurrency of the first run of faster (empty where the lowest is not
    faster), the lowest concurrency inconclusive and the lowest slower (empty where none), and the speedup with its
    interval at the highest concurrency tested."""
    spec = cell_states(frame)
    ar = _ar_keys(frame)
    spec = spec[
        pd.Series([(r.tp, r.workload, r.concurrency) in ar for r in spec.itertuples()], index=spec.index, dtype=bool)
    ]
    rows = []
    for (tp, method, workload), g in spec.groupby(["tp", "method", "workload"], sort=True):
        g = g.sort_values("concurrency")
        conc, states = [int(c) for c in g["concurrency"]], list(g["verdict"])
        prefix = next((i for i, s in enumerate(states) if s != FASTER), len(states))
        top = g.iloc[-1]
        rows.append(
            {
                "tp": tp,
                "method": method,
                "workload": workload,
                "break_even": break_even_words(conc, states),
                "states": "; ".join(f"{c} {s}" for c, s in zip(conc, states)),
                "faster_up_to": conc[prefix - 1] if prefix else None,
                "first_inconclusive": next((c for c, s in zip(conc, states) if s == INCONCLUSIVE), None),
                "first_slower": next((c for c, s in zip(conc, states) if s == SLOWER), None),
                "highest_concurrency_tested": conc[-1],
                "speedup_at_highest": top["speedup"],
                "speedup_at_highest_lo": top["speedup_lo"],
                "speedup_at_highest_hi": top["speedup_hi"],
            }
        )
    out = pd.DataFrame(rows, columns=BREAK_EVEN_COLUMNS)
    for col in ("faster_up_to", "first_inconclusive", "first_slower"):
        out[col] = out[col].astype("Int64")
    return out


# The method parameters summary.csv has a column each for (aggregate.method_columns), besides accept_length:
# acceptance forced on the server (SGLANG_SIMULATE_ACC_LEN; empty: the drafter's own).
METHOD_PARAMETERS = ("block_size", "budget", "topk", "num_steps", "num_draft_tokens", "max_bfs_breadth", "match_type")
# Break-even acceptance: the methods that differ only in their forced acceptance (``accept_length``) form a family;
# these columns, beside the cell's keys, are what the family's methods share (aggregate.method_columns less
# accept_length).
FAMILY_COLUMNS = [
    "algorithm",
    *METHOD_PARAMETERS,
    "drafter",
    "tree_build",
    "tree_mode",
    "tree_width",
    "verify_width",
    "sweep_size",
]
BELOW, ABOVE, INTERPOLATED, NOT_DECIDED = "below", "above", "interpolated", "not decided"
INTERVAL_WORDS = "95% CI about "  # before an interpolated break-even's interval, in its words
ACCEPTANCE_BREAK_EVEN_COLUMNS = [
    "simulated",
    "tp",
    "workload",
    "concurrency",
    "engine",
    "family",
    "algorithm",
    "tree_mode",
    "forced_lengths",
    "speedups",
    "outcome",
    "break_even_acceptance",
    "break_even_acceptance_lo",
    "break_even_acceptance_hi",
    "break_even",
]


def family_name(method: str, accept_length: float) -> str:
    """A forced method's family: its name less the sweep tag of its forced acceptance (eagle3-chain-a3@e ->
    eagle3-chain@e); the name itself where it carries no such tag (a single forced length)."""
    return re.sub(rf"-a{re.escape(f'{accept_length:g}')}(?=-|@|$)", "", method, count=1)


def crossing(lengths: Sequence[float], values: Sequence[float], at_one_counts: bool = False) -> float:
    """Where the piecewise-linear curve of ``values`` against ``lengths`` (ascending) last rises through 1: from the
    last length whose value is below 1 (at most 1 with ``at_one_counts``) to the next, interpolated linearly; -inf
    where no value is below 1 (it is above 1 from the lowest length on), +inf where the highest length's is."""
    below = [i for i, v in enumerate(values) if v < 1 or (at_one_counts and v == 1)]
    if not below:
        return -math.inf
    i = below[-1]
    if i == len(values) - 1:
        return math.inf
    (l0, l1), (v0, v1) = lengths[i : i + 2], values[i : i + 2]
    return l0 + (1 - v0) * (l1 - l0) / (v1 - v0)


def _length_text(value: float, lengths: Sequence[float]) -> str:
    """An acceptance to two decimals, or "<L_min" / ">L_max" where it lies outside the forced lengths."""
    if value == -math.inf:
        return f"<{lengths[0]:g}"
    return f">{lengths[-1]:g}" if value == math.inf else f"{value:.2f}"


def acceptance_break_even_of(lengths: Sequence[float], speedups, los, his) -> dict:
    """One family's break-even acceptance at one cell from its speedups over AR (with the paired 95% intervals
    [lo, hi]) at the forced lengths (ascending): the outcome, the estimate with its interval (NaN where outside the
    lengths) and the words.

    At a fixed cost of a round, speedup is close to linear in the tokens a round commits, so between the two forced
    lengths that bracket it the acceptance at which speedup = 1 is read by linear interpolation (``crossing``: the
    last rise through 1, from which the method pays at every higher forced length). Its interval interpolates the
    interval bounds the same way: the upper bound's curve crosses 1 first (the interval's low end), the lower
    bound's last (its high end); approximate, as the interpolation is. Outcomes: "below" (faster already at the
    lowest forced length: speedup_lo > 1), "above" (slower at the highest: speedup_hi < 1), "not decided" (a cell
    without an interval, or an interval that spans every forced length: inconclusive at the lowest and at the
    highest), else "interpolated": e.g. "2.41 (95% CI about 2.22 to 2.58)", a bound outside the lengths
    written "<2" or ">4"."""
    lengths = [float(x) for x in lengths]
    numbers = [[_number(v) for v in col] for col in (speedups, los, his)]
    out = {"outcome": NOT_DECIDED, "estimate": math.nan, "lo": math.nan, "hi": math.nan, "words": NOT_DECIDED}
    if any(v is None for col in numbers for v in col):
        return {**out, "words": "not decided (a cell without a speedup interval)"}
    s, lo, hi = ([v for v in col if v is not None] for col in numbers)
    if lo[0] > 1:
        return {**out, "outcome": BELOW, "words": f"below {lengths[0]:g}"}
    if hi[-1] < 1:
        return {**out, "outcome": ABOVE, "words": f"above {lengths[-1]:g}"}
    estimate, low, high = crossing(lengths, s), crossing(lengths, hi), crossing(lengths, lo, at_one_counts=True)
    if math.isinf(low) and math.isinf(high):
        return out
    values = {k: v if math.isfinite(v) else math.nan for k, v in (("estimate", estimate), ("lo", low), ("hi", high))}
    words = [_length_text(v, lengths) for v in (estimate, low, high)]
    return {**values, "outcome": INTERPOLATED, "words": f"{words[0]} ({INTERVAL_WORDS}{words[1]} to {words[2]})"}


def acceptance_break_even(frame: pd.DataFrame) -> pd.DataFrame:
    """Break-even acceptance per (TP, workload, concurrency, engine) and family of forced methods of combined.csv
    (those with ``accept_length`` that share every other parameter, FAMILY_COLUMNS, and their name less its forced
    tag): the acceptance length at which the family's speedup over AR is 1 (acceptance_break_even_of), from its
    cells with a speedup (an AR cell at the same TP, workload and concurrency). It is the tokens a round a trained
    drafter must commit on this GPU and model for the method to pay at that concurrency; the acceptance was forced,
    never a drafter's own."""
    if "accept_length" not in frame or frame["accept_length"].isna().all():
        return pd.DataFrame(columns=ACCEPTANCE_BREAK_EVEN_COLUMNS)
    forced = frame[frame["accept_length"].notna() & frame["speedup"].notna()]
    forced = forced.assign(
        family=[family_name(m, a) for m, a in zip(forced["method"], forced["accept_length"])],
        engine=forced["engine"].astype(object).fillna("") if "engine" in forced else "",
        **{c: forced[c].astype(object).where(forced[c].notna(), "") for c in FAMILY_COLUMNS if c in forced},
    )
    keys = ["tp", "workload", "concurrency", "engine", "family", *(c for c in FAMILY_COLUMNS if c in forced)]
    rows = []
    for key, g in forced.groupby(keys, sort=True):
        g = g.sort_values("accept_length")
        lengths = list(g["accept_length"])
        found = acceptance_break_even_of(lengths, g["speedup"], g["speedup_lo"], g["speedup_hi"])
        rows.append(
            {
                **dict(zip(keys, key)),
                "simulated": bool(g["simulated"].astype(bool).any()),
                "forced_lengths": "; ".join(f"{x:g}" for x in lengths),
                "speedups": "; ".join(
                    f"{x:g} {ratio(v, a, b)}"
                    for x, v, a, b in zip(lengths, g["speedup"], g["speedup_lo"], g["speedup_hi"])
                ),
                "outcome": found["outcome"],
                "break_even_acceptance": found["estimate"],
                "break_even_acceptance_lo": found["lo"],
                "break_even_acceptance_hi": found["hi"],
                "break_even": found["words"],
            }
        )
    out = pd.DataFrame(rows, columns=ACCEPTANCE_BREAK_EVEN_COLUMNS)
    return out.assign(tree_mode=out["tree_mode"].where(out["tree_mode"] != "", None))  # a chain of no mode: empty


def ratio(value, lo=None, hi=None) -> str:
    """A speedup as the text prints it: "1.52x (95% CI 1.40-1.65)", "1.52x (no interval)"."""
    value, lo, hi = _number(value), _number(lo), _number(hi)
    if value is None:
        return "no speedup"
    interval = f"95% CI {lo:.2f}-{hi:.2f}" if lo is not None and hi is not None else "no interval"
    return f"{value:.2f}x ({interval})"


def _top(frame: pd.DataFrame, column: str) -> pd.Series:
    """The row of ``frame`` with the highest value of ``column`` (the first of equals)."""
    return frame.sort_values(column, ascending=False, kind="stable").iloc[0]


def _ratio_of(row) -> str:
    """A cell's speedup with its interval, as ratio prints it."""
    return ratio(row["speedup"], row["speedup_lo"], row["speedup_hi"])


def _where(row, with_tp: bool) -> str:
    return f"{row['workload']}, concurrency {row['concurrency']}" + (f", TP {row['tp']}" if with_tp else "")


def findings(frame: pd.DataFrame, table: pd.DataFrame, breakeven: pd.DataFrame, most: int = 5) -> list[str]:
    """Up to ``most`` findings written from the data, each with its numbers and interval, in this order where the
    data has them: the largest decided speedup (and the largest not resting on an acceptance artefact, where the
    first does); where the method fastest at the lowest concurrency stops paying; the methods never faster; the
    cells where even the best method is slower than AR; the inconclusive cells and the widest interval among them;
    acceptance artefacts."""
    spec = cell_states(frame)
    if spec.empty or spec["speedup"].notna().sum() == 0:
        return []
    spec = spec.assign(artefact=acceptance_artefact(spec))
    with_tp = spec["tp"].nunique() > 1
    out = _largest(spec, with_tp) + _stops_paying(table, breakeven, spec, with_tp) + _never_faster(breakeven, spec)
    out += _leader_changes(table, spec, with_tp)
    out += _even_best_slower(table, with_tp) + _inconclusive(spec, with_tp) + _artefacts(spec)
    return out[:most]


def _largest(spec: pd.DataFrame, with_tp: bool) -> list[str]:
    faster = spec[spec["verdict"] == FASTER]
    if faster.empty:
        top = _top(spec, "speedup")
        return [
            f"No speculative method is decided faster than AR anywhere: the highest speedup measured is "
            f"{top['method']}'s on {_where(top, with_tp)}: {_ratio_of(top)}."
        ]
    top = _top(faster, "speedup")
    text = f"Largest decided speedup: {top['method']} on {_where(top, with_tp)}, {_ratio_of(top)}"
    if not top["artefact"]:
        return [text + "."]
    real = faster[~faster["artefact"]]
    if real.empty:
        return [
            text + ": an acceptance artefact (see the caveats); no method whose acceptance is not an artefact is "
            "decided faster anywhere."
        ]
    second = _top(real, "speedup")
    return [
        text + ": an acceptance artefact (see the caveats). The largest that is not: "
        f"{second['method']} on {_where(second, with_tp)}, "
        f"{_ratio_of(second)}."
    ]


def _stops_paying(table: pd.DataFrame, breakeven: pd.DataFrame, spec: pd.DataFrame, with_tp: bool) -> list[str]:
    """Where the method decided fastest at the lowest concurrency of a workload stops paying (the first workload and
    TP where it does; else that it pays at every concurrency measured)."""
    if table.empty or breakeven.empty:
        return []
    low = table[(table["concurrency"] == table.groupby(["tp", "workload"])["concurrency"].transform("min"))]
    low = low[low["verdict"] == FASTER]
    for _, row in low.iterrows():
        be = breakeven[
            (breakeven["tp"] == row["tp"])
            & (breakeven["workload"] == row["workload"])
            & (breakeven["method"] == row["best"])
        ]
        if (
            be.empty
            or pd.isna(be.iloc[0]["faster_up_to"])
            or be.iloc[0]["faster_up_to"] == be.iloc[0]["highest_concurrency_tested"]
        ):
            continue
        b = be.iloc[0]
        cells = spec[
            (spec["tp"] == row["tp"]) & (spec["workload"] == row["workload"]) & (spec["method"] == row["best"])
        ]
        cells = cells.set_index("concurrency")
        after = cells[cells.index > b["faster_up_to"]].iloc[0]
        last = cells.loc[b["faster_up_to"]]
        where = f"on {row['workload']}" + (f", TP {row['tp']}" if with_tp else "")
        return [
            f"{row['best']}, the fastest {where} at concurrency {row['concurrency']}, is {b['break_even']}: at "
            f"{int(b['faster_up_to'])} {_ratio_of(last)}, at {after.name} "
            f"{_ratio_of(after)}."
        ]
    paying = [r for _, r in low.iterrows() if _pays_throughout(breakeven, r)]
    if paying:
        r = paying[0]
        top = int(table[(table["tp"] == r["tp"]) & (table["workload"] == r["workload"])]["concurrency"].max())
        return [
            f"{r['best']}, the fastest on {r['workload']} at concurrency {r['concurrency']}, is faster than AR at "
            f"every concurrency measured there (up to {top})."
        ]
    return []


def _pays_throughout(breakeven: pd.DataFrame, row: pd.Series) -> bool:
    be = breakeven[
        (breakeven["tp"] == row["tp"])
        & (breakeven["workload"] == row["workload"])
        & (breakeven["method"] == row["best"])
    ]
    return not be.empty and be.iloc[0]["break_even"] == "faster at every concurrency measured"


def _leader_changes(table: pd.DataFrame, spec: pd.DataFrame, with_tp: bool) -> list[str]:
    """The first workload (and TP) where the best method changes with concurrency, and at which concurrencies the
    runner-up's 95% throughput interval overlaps the best's (the order between them not decided there)."""
    for (tp, workload), g in table.groupby(["tp", "workload"], sort=False):
        if g["best"].nunique() < 2:
            continue
        close = []
        for _, row in g.iterrows():
            cell = spec[
                (spec["tp"] == tp) & (spec["workload"] == workload) & (spec["concurrency"] == row["concurrency"])
            ]
            others = cell[cell["method"] != row["best"]]
            best = cell[cell["method"] == row["best"]].iloc[0]
            if len(others) and pd.notna(best["output_throughput_lo"]):
                runner = _top(others, "output_throughput")
                if (
                    pd.notna(runner["output_throughput_hi"])
                    and runner["output_throughput_hi"] >= best["output_throughput_lo"]
                ):
                    close.append(f"{row['concurrency']} ({runner['method']})")
        where = f"on {workload}" + (f", TP {tp}" if with_tp else "")
        order = ", ".join(f"{r['best']} at {r['concurrency']}" for _, r in g.iterrows())
        text = f"The fastest method {where} changes with concurrency: {order}"
        if close:
            text += (
                f"; at {', '.join(close)} the runner-up's 95% throughput interval overlaps the leader's, so the order "
                "between them is not decided there"
            )
        return [text + "."]
    return []


def _never_faster(breakeven: pd.DataFrame, spec: pd.DataFrame) -> list[str]:
    """The methods slower than AR at every concurrency of every workload and TP they were measured on, with the
    range of their speedups."""
    if breakeven.empty:
        return []
    never = breakeven.groupby("method")["break_even"].apply(lambda words: (words == "never faster").all())
    names = [str(m) for m, is_never in never.items() if is_never]
    if not names:
        return []
    cells = spec[spec["method"].isin(names)]
    best = _top(cells, "speedup")
    return [
        f"Never faster than AR, slower at every concurrency and workload measured: {', '.join(names)} "
        f"(speedups {cells['speedup'].min():.2f}x to {cells['speedup'].max():.2f}x; the highest, {best['method']} "
        f"on {best['workload']} at {best['concurrency']}, {_ratio_of(best)})."
    ]


def _even_best_slower(table: pd.DataFrame, with_tp: bool) -> list[str]:
    slower = table[table["verdict"] == SLOWER]
    if slower.empty:
        return []
    cells = "; ".join(f"{_where(r, with_tp)} (best {r['best']}, {_ratio_of(r)})" for _, r in slower.head(3).iterrows())
    more = f" and {len(slower) - 3} more" if len(slower) > 3 else ""
    return [
        f"Even the fastest speculative method is slower than AR in {len(slower)} of {len(table)} cells: {cells}{more}."
    ]


def _inconclusive(spec: pd.DataFrame, with_tp: bool) -> list[str]:
    open_ = spec[spec["verdict"] == INCONCLUSIVE]
    if open_.empty:
        return [f"Every one of the {len(spec)} speculative cells is decided: no 95% interval contains 1."]
    no_interval = open_[open_["reason"] != ""]
    text = f"{len(open_)} of {len(spec)} speculative cells are inconclusive"
    parts = []
    if len(no_interval):
        reasons = sorted(set(no_interval["reason"]))
        parts.append(
            f"{len(no_interval)} without an interval ({'; '.join(r.removeprefix('no interval: ') for r in reasons)})"
        )
    wide = open_[open_["reason"] == ""]
    if len(wide):
        w = _top(wide.assign(width=wide["speedup_hi"] - wide["speedup_lo"]), "width")
        parts.append(
            f"{len(wide)} whose interval contains 1, the widest {w['method']} on {_where(w, with_tp)}: {_ratio_of(w)}"
        )
    return [text + ": " + "; ".join(parts) + "."]


def _artefacts(spec: pd.DataFrame) -> list[str]:
    art = spec[spec["artefact"]]
    if art.empty:
        return []
    by_method = art.groupby("method")["acceptance_length"].max().sort_values(ascending=False)
    names = ", ".join(f"{m} {a:.2f}" for m, a in by_method.items())
    return [
        f"Acceptance lengths that are artefacts (tokens a round, highest per method): {names}; their speedups are "
        "not a model's (see the caveats)."
    ]


# ---- the stamp and its caveats ------------------------------------------------------------------------------------


def _algorithm_title(name: str) -> str:
    try:
        return algorithms.get(name).title
    except algorithms.AlgorithmError:
        return name


def _drafts_from_text(name: str) -> bool:
    """Whether the algorithm drafts from the text already in the request (NGRAM: no drafter, no head)."""
    try:
        algorithm = algorithms.get(name)
    except algorithms.AlgorithmError:
        return False
    return algorithm.speculative and algorithm.drafter is None


def stamp(
    frame: pd.DataFrame,
    environment: dict,
    model: str,
    dates: Sequence[str] = (),
    sim_profile: str = "",
    pareto: pd.DataFrame | None = None,
    engines: str = "",
) -> dict:
    """What the numbers are: {"flags": SIMULATED, DUMMY WEIGHTS, ACCEPTANCE FORCED (those that apply) or MEASURED,
    "text": one line saying where and on what they were measured (GPU model and count, engine name, version and
    commit or build, model, weights, TP sizes, dates), "caveats": sentences written from the data}; from combined.csv
    (``frame``), the environment record of the backend, the model's name, the cells' finishing times (``dates``,
    ISO), for a simulated run what the simulated server emulates (``sim_profile``), the Pareto table (pareto.csv:
    which of its frontier points are artefacts) and, where the run compares engines, their names (``engines``:
    engines_text), which replace the one engine's."""
    simulated = bool(frame["simulated"].astype(str).eq("True").any()) or bool(environment.get("simulated"))
    dummy = "load_format" in frame and bool(frame["load_format"].eq("dummy").any())
    forced = frame[frame["accept_length"].notna()] if "accept_length" in frame else frame.iloc[0:0]
    flags = [
        f for f, on in (("SIMULATED", simulated), ("DUMMY WEIGHTS", dummy), ("ACCEPTANCE FORCED", len(forced))) if on
    ]
    tps = ", ".join(str(int(t)) for t in sorted(frame["tp"].unique())) if len(frame) else "--"
    days = sorted({d[:10] for d in dates if isinstance(d, str) and d})
    when = (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}") if days else "date not recorded"
    weights = "dummy (random weights of the model's shape)" if dummy else "real"
    if simulated:
        text = (
            f"Produced by specsweep's simulated SGLang server emulating {sim_profile or 'a modelled GPU'}; no model "
            f"ran on a GPU. Model {model}, TP {tps}, {when}."
        )
    else:
        text = (
            f"Measured on {gpus_text(environment)}, {engines or engine_text(environment)}; model {model}, "
            f"weights {weights}, TP {tps}, {when}."
        )
    caveats = []
    if simulated:
        caveats.append(
            "Warning: simulated results. Every number comes from the simulated server's cost and acceptance model: use "
            "it to check the workflow and the shape of the results, never as a measurement."
        )
    if dummy:
        caveats.append(dummy_weights_caveat(frame))
    if len(forced):
        caveats.append(forced_caveat(forced))
    if pareto is not None and "artefact" in pareto and (dummy or len(forced)):
        caveats += pareto_caveat(pareto)
    if len(frame) and not (frame["algorithm"] == algorithms.BASELINE).any():
        caveats.append("No AR method was measured: there is no speedup and no verdict.")
    return {"flags": flags or ["MEASURED"], "text": text, "caveats": caveats}


def gpus_text(environment: dict) -> str:
    """The GPUs the cells ran on as the stamp and provenance name them (n x name, ...); on backend external, that
    the servers do not report theirs (the client's run none of them)."""
    if environment.get("backend") == "external":
        return "GPUs not reported by the external servers"
    gpus = [g.get("name", "GPU") for g in (environment.get("hardware") or {}).get("gpus") or []]
    if not gpus:
        return "a host whose GPUs were not recorded"
    counts = {name: gpus.count(name) for name in dict.fromkeys(gpus)}
    return " and ".join(f"{n} x {name}" for name, n in counts.items())


def engine_text(environment: dict) -> str:
    """The engine as the stamp and provenance name it: name and version, then its commit, its build, or the digest of
    the wheel it was installed from; on backend external, each distinct engine the servers describe, as they do."""
    if environment.get("backend") == "external":
        described = (environment.get("servers") or {}).values()
        engines = dict.fromkeys(_engine(server) for server in described)
        return ", ".join(engines) or "external servers (not described)"
    return _engine(environment.get("server") or {}, environment.get("backend", "server"))


def engines_text(builds: pd.DataFrame) -> str:
    """The engines as the stamp names them where a run compares two or more (aggregate.engine_builds' table: an item
    per row, a column per engine): "engines NAME (sglang VERSION, commit C or wheel sha256 D) and ..."; empty with
    one engine."""
    names = [c for c in builds.columns if c not in ("item", "differs")]
    if len(names) < 2 or "item" not in builds:
        return ""
    rows = builds.set_index("item")

    def value(item: str, name: str) -> str:
        v = str(rows.at[item, name]) if item in rows.index else ""
        return "" if v in ("", "nan", "None") else v

    def described(name: str) -> str:
        version, source = value("sglang", name), value("commit or wheel", name)
        origin = f"wheel sha256 {source[7:19]}" if source.startswith("sha256=") else f"commit {source[:12]}"
        return f"{name} (sglang {version or 'version not recorded'}, {origin if source else 'no commit recorded'})"

    return "engines " + " and ".join(described(n) for n in names)


def _engine(server: dict, backend: str = "server") -> str:
    """One server record's engine (environment.probe's or external.environment's ``server``)."""
    name, version = server.get("name", backend), str(server.get("version") or "")
    name = version if version.startswith(name) else f"{name} {version}".strip()  # "specsweep-sim 0.9", said once
    source = (server.get("source") or {}).get("archive_info", {}).get("hash")
    if server.get("commit"):
        return f"{name} (commit {str(server['commit'])[:12]})"
    if server.get("build"):
        return f"{name} (build {server['build']})"
    if source:
        return f"{name} (wheel {source.replace('sha256=', 'sha256 ')[:19]})"
    return f"{name} (release; no commit recorded)"


def dummy_weights_caveat(frame: pd.DataFrame) -> str:
    """The caveat of a run on dummy (random) weights, written from its acceptance lengths: the methods whose
    acceptance is well above 1 (above ARTEFACT_ACCEPTANCE, not forced) and why that is an artefact, and the methods
    whose drafter accepts about 1 and what their speedups then measure."""
    spec = frame[(frame["algorithm"] != algorithms.BASELINE) & frame["acceptance_length"].notna()]
    if "accept_length" in spec:
        spec = spec[spec["accept_length"].isna()]
    per = spec.groupby("method").agg(algorithm=("algorithm", "first"), acceptance=("acceptance_length", "max"))
    high = per[per["acceptance"] > ARTEFACT_ACCEPTANCE].sort_values("acceptance", ascending=False)
    low = per[per["acceptance"] <= ARTEFACT_ACCEPTANCE]
    text = "Dummy weights: the servers loaded random weights of the model's shape, so acceptance is not a model's."
    lookup = high[[_drafts_from_text(a) for a in high["algorithm"]]]
    other = high.drop(lookup.index)
    if len(lookup):
        names = ", ".join(f"{m} ({_algorithm_title(r.algorithm)}) {r.acceptance:.2f}" for m, r in lookup.iterrows())
        text += (
            f" Acceptance well above 1 ({names} tokens a round) is an artefact: a randomly initialised model's greedy "
            "output falls into a loop of a few tokens, and n-gram lookup drafts that loop from the text already "
            "generated, so nearly every draft is accepted; their speedups say nothing about a real model."
        )
    if len(other):
        names = ", ".join(f"{m} {r.acceptance:.2f}" for m, r in other.iterrows())
        text += f" {names} accept well above 1 although their drafters have random weights: check their drafters."
    if len(low):
        titles = ", ".join(dict.fromkeys(_algorithm_title(a) for a in low["algorithm"]))
        lo_a, hi_a = low["acceptance"].min(), low["acceptance"].max()
        span = f"{lo_a:.2f}" if round(lo_a, 2) == round(hi_a, 2) else f"{lo_a:.2f}-{hi_a:.2f}"
        text += (
            f" A random drafter predicts nothing: {titles} accept {span} tokens a round here, so their speedups "
            "measure only the cost of drafting and verifying."
        )
    return text


def pareto_caveat(pareto: pd.DataFrame) -> list[str]:
    """Where the Pareto frontier (pareto.csv: on_frontier per workload) is made of points whose acceptance is an
    artefact: how many of its points, and which (method and concurrencies per workload)."""
    front = pareto[pareto["on_frontier"].astype(str) == "True"]
    art = front[front["artefact"].astype(str) == "True"]
    if art.empty:
        return []
    where = "; ".join(
        f"{workload}: {method} at {', '.join(str(int(c)) for c in sorted(g['concurrency']))}"
        for (workload, method), g in art.groupby(["workload", "method"], sort=False)
    )
    return [
        f"{len(art)} of the {len(front)} points on the Pareto frontiers (throughput per GPU against interactivity) are "
        f"acceptance artefacts ({where}): read those frontiers as the engine's cost at that acceptance, not a model's."
    ]


def forced_caveat(forced: pd.DataFrame) -> str:
    """The caveat of methods whose acceptance was forced on the server (``accept_length``)."""
    per = forced.groupby("method")["accept_length"].first()
    names = ", ".join(f"{m} ({a:g})" for m, a in per.items())
    return (
        f"Acceptance forced on {names}: SGLANG_SIMULATE_ACC_LEN makes each verify round commit that many tokens on "
        "average whatever the drafter proposed; their numbers are the engine's cost at that acceptance, never a "
        "drafter's acceptance or speedup."
    )


# ---- the workload and confidence lines ------------------------------------------------------------------------------


def _span(values: pd.Series, unit: str) -> str:
    """A column of counts as the workload line says it: "mean 120 tokens (31-433)", or "128 tokens in every
    request" where all are equal."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return f"{unit} not recorded"
    lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        return f"{lo:,} {unit} in every request"
    return f"mean {values.mean():,.0f} {unit} ({lo:,}-{hi:,})"


def workload_lines(frame: pd.DataFrame, requests: pd.DataFrame, temperature: str) -> list[str]:
    """One line per workload: input (prompt) and output tokens per request as measured (completed requests of every
    cell: mean and range), the content mix, the temperature (``temperature``: the sampling configuration's, as text),
    sessions and requests per cell as actually run (requests_sent per launch; sessions counted in the records), and
    launches per cell; a traced workload's trace, window and time scale (aggregate.trace_text)."""
    lines = []
    for workload, group in frame.groupby("workload", sort=False):
        reqs = requests[requests["workload"] == workload] if len(requests) else requests
        ok = reqs[reqs["error"].isna()] if "error" in reqs else reqs
        cell_keys = ["tp", "method", "concurrency", "repetition"]
        sessions = reqs.groupby(cell_keys)["session"].nunique() if len(reqs) else pd.Series(dtype=float)
        sent = reqs.groupby(cell_keys).size() if len(reqs) else group["requests_sent"]
        per_cell = count_span(sessions) + " sessions"
        if len(reqs) and not (sessions.to_numpy() == sent.to_numpy()).all():
            per_cell += f" ({count_span(sent)} requests)"
        launches = count_span(group["launches"])
        empty = pd.Series(dtype=float)
        lines.append(
            f"{workload}: input {_span(ok['prompt_tokens'] if len(ok) else empty, 'tokens')}, output "
            f"{_span(ok['output_tokens'] if len(ok) else empty, 'tokens')}; content {group['content_mix'].iloc[0]}; "
            f"{temperature}; {per_cell} per cell; {launches} launch{'es' if launches != '1' else ''} per cell"
            + (
                f"; {trace}."
                if isinstance(trace := group.get("trace", pd.Series([""])).iloc[0], str) and trace
                else "."
            )
        )
    return lines


def count_span(values: pd.Series) -> str:
    """A count's range as text: "16" where every value is 16, "16-128" from 16 to 128, -- where there is none."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return "--"
    lo, hi = int(values.min()), int(values.max())
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def confidence_line(
    frame: pd.DataFrame, launches: pd.DataFrame | None = None, requests: pd.DataFrame | None = None
) -> str:
    """How far the verdict can be trusted, from combined.csv (``frame``), the per-launch summary (``launches``) and the
    request records (``requests``, requests.csv): sessions per cell (counted in the records, else requests_sent) and
    the speculative cells without an interval; launches per cell and, where a cell was
    launched more than once, whether its launches agree within their own 95% throughput intervals (the intervals
    of every launch share a value: launch-to-launch variation inside the intervals); failed requests and cells not
    final; whether the acceptance estimates (requests' counters, the server's, tokens per chunk) agree within 2%."""
    spec = cell_states(frame)
    parts = [_sessions_part(frame, spec, requests), _launches_part(frame, launches), _failures_part(frame)]
    parts.append(_acceptance_part(spec))
    return "; ".join(p for p in parts if p) + "."


def _sessions_part(frame: pd.DataFrame, spec: pd.DataFrame, requests: pd.DataFrame | None) -> str:
    if requests is not None and len(requests):
        sessions = requests.groupby(["tp", "method", "workload", "concurrency", "repetition"])["session"].nunique()
        text = f"{count_span(sessions)} sessions per cell"
    else:
        text = f"{count_span(frame['requests_sent'])} requests per cell"
    missing = spec[spec["reason"] != ""]
    if spec.empty:
        return text
    if missing.empty:
        return text + f"; every one of the {len(spec)} speculative cells has a paired 95% interval"
    reasons = "; ".join(sorted({r.removeprefix("no interval: ") for r in missing["reason"]}))
    return f"{text}; {len(missing)} of {len(spec)} speculative cells have no interval ({reasons})"


def _launches_part(frame: pd.DataFrame, launches: pd.DataFrame | None) -> str:
    most = int(pd.to_numeric(frame["launches"], errors="coerce").fillna(1).max()) if len(frame) else 1
    if most <= 1:
        return (
            "one launch per cell: the intervals hold session-to-session variation within a launch, not "
            "launch-to-launch variation (set repetitions to measure it)"
        )
    if launches is None or launches.empty:
        return f"up to {most} launches per cell"
    keys = ["tp", "method", "workload", "concurrency"]
    repeated, apart = 0, []
    for key, g in launches.groupby(keys):
        if len(g) < 2 or g["output_throughput_lo"].isna().any() or g["output_throughput_hi"].isna().any():
            continue
        repeated += 1
        if g["output_throughput_lo"].max() > g["output_throughput_hi"].min():
            apart.append(f"{key[1]} on {key[2]} at {key[3]}")
    if not repeated:
        return f"up to {most} launches per cell, none with intervals to compare"
    if not apart:
        return (
            f"up to {most} launches per cell: in every one of the {repeated} repeated cells the launches' 95% "
            "throughput intervals overlap (launch-to-launch variation inside the intervals)"
        )
    return (
        f"up to {most} launches per cell: in {len(apart)} of {repeated} repeated cells "
        f"the launches' 95% throughput intervals do not overlap ({', '.join(apart[:3])}"
        f"{' and more' if len(apart) > 3 else ''}): launch-to-launch variation exceeds the within-launch intervals"
    )


def _failures_part(frame: pd.DataFrame) -> str:
    failed = int(pd.to_numeric(frame["requests_failed"], errors="coerce").fillna(0).sum())
    sent = int(pd.to_numeric(frame["requests_sent"], errors="coerce").fillna(0).sum())
    text = f"no request failed (of {sent:,})" if not failed else f"{failed:,} of {sent:,} requests failed"
    if failed:
        cells = frame[frame["requests_failed"] > 0]
        text += f" in {len(cells)} cells"
    if "final" in frame:
        not_final = frame[frame["final"].astype(str) == "False"]
        if len(not_final):
            text += f"; {len(not_final)} cells are not final (kept with failures.keep_going)"
    return text


def _acceptance_part(spec: pd.DataFrame) -> str:
    spec = spec[spec["acceptance_length"].notna()] if "acceptance_length" in spec else spec.iloc[0:0]
    if spec.empty:
        return ""
    disagree = (
        spec[spec["acceptance_disagree"].astype(str) == "True"] if "acceptance_disagree" in spec else spec.iloc[0:0]
    )
    if disagree.empty:
        return (
            f"the acceptance estimates (requests' counters, server counters, tokens per chunk) agree within "
            f"{DISAGREE_TOLERANCE:.0%} in every one of the {len(spec)} speculative cells"
        )
    names = ", ".join(f"{r.method} on {r.workload} at {r.concurrency}" for r in disagree.head(3).itertuples())
    return (
        f"the acceptance estimates disagree by more than {DISAGREE_TOLERANCE:.0%} in {len(disagree)} of {len(spec)} "
        f"speculative cells ({names}{' and more' if len(disagree) > 3 else ''})"
    )


def heatmap_panels(frame: pd.DataFrame, methods: Sequence[str] = ()) -> list[dict]:
    """The speedup heatmap's panels, one per (workload, TP) in the order of combined.csv: {"workload", "tp",
    "methods" (rows: the speculative methods measured there, in the order of ``methods``, then by name),
    "concurrencies" (columns, ascending), "cells": {(method, concurrency): {"speedup", "lo", "hi", "verdict",
    "artefact"}}} from the speculative cells' states (cell_states)."""
    spec = cell_states(frame)
    if spec.empty:
        return []
    spec = spec.assign(artefact=acceptance_artefact(spec))
    rank = {m: i for i, m in enumerate(methods)}
    panels = []
    for (workload, tp), g in spec.groupby(["workload", "tp"], sort=False):
        names = sorted(g["method"].unique(), key=lambda m: (rank.get(m, len(rank)), m))
        cells = {
            (r["method"], int(r["concurrency"])): {
                "speedup": _number(r["speedup"]),
                "lo": _number(r["speedup_lo"]),
                "hi": _number(r["speedup_hi"]),
                "verdict": r["verdict"],
                "artefact": bool(r["artefact"]),
            }
            for _, r in g.iterrows()
        }
        conc = sorted(int(c) for c in g["concurrency"].unique())
        panels.append(
            {"workload": workload, "tp": int(str(tp)), "methods": names, "concurrencies": conc, "cells": cells}
        )
    return panels
