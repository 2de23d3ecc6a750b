"""Aggregation: cell JSON files into one tidy table (one row per cell), speedups over AR.

Every number is computed from the cells' raw records by today's formulas (metrics.cell_measures); the metrics a
cell stores are a copy for its readers and never feed a table. The workflow aggregates only verified cells
(verified_cells): each must be the cell, with the prompts and key, that the configuration gives its path.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pandas as pd

from . import algorithms, ddtree_profile, engines, verdict
from .cells import cell_problem, keyed_cells, unfinished
from .external import server_key
from .server_job import ServerJob
from .slo import Slo, capacity, combined_columns, judge
from .slo import cell_columns as slo_columns
from .slo import cell_measures as slo_measures
from .canon import atomic_write_text
from . import implied
from .sequential import verdict_interval
from .metrics import (
    acceptance_by_depth,
    acceptance_length,
    cell_measures,
    combine_launches,
    concurrency_report,
    conditional_acceptance,
    drafts_accepted,
    e2e,
    kind_throughput,
    losslessness,
    median_ratio,
    of_kind,
    queue_delay,
    speedup,
    throughput_ci,
    tpot,
    ttft,
    user_ttft,
)


def _get(metrics: dict, name: str, stat: str):
    return metrics.get(name, {}).get(stat)


def _ci(metrics: dict, name: str, stat: str, side: int):
    ci = metrics.get(name, {}).get(f"{stat}_ci")
    return ci[side] if ci else None


# the latency columns of the summary, by measure: each statistic, "<stat>_lo" and "<stat>_hi" its 95% interval
LATENCY_COLUMNS = {
    "ttft": ("n", "p50", "p50_lo", "p50_hi", "p99", "p99_lo", "p99_hi"),
    "queue_delay": ("p50", "p99"),
    "user_ttft": ("p50", "p99"),
    "tpot": ("n", "mean", "p50", "p50_lo", "p50_hi", "p99"),
    "itl": ("n", "p50", "p99"),
    "e2e": ("n", "p50", "p99"),
}


def latency_columns(m: dict) -> dict:
    """The summary's latency columns of a cell's measures (LATENCY_COLUMNS, in order): "<measure>_<stat>"."""
    out = {}
    for name, stats in LATENCY_COLUMNS.items():
        for stat in stats:
            base, _, side = stat.partition("_")
            value = _ci(m, name, base, ["lo", "hi"].index(side)) if side in ("lo", "hi") else _get(m, name, stat)
            out[f"{name}_{stat}"] = value
    return out


def method_columns(method: dict) -> dict:
    """The summary's columns of a cell's method: its algorithm, parameters, drafter, tree (build, mode, width), the
    tokens it verifies a round and the size its sweep varies."""
    algorithm = algorithms.get(method["algorithm"])  # a cell's record: its algorithm read back by name
    params = method["params"]
    tree_build, mode, width = algorithm.tree(params)
    return {
        "algorithm": method["algorithm"],
        **{k: params.get(k) for k in (*verdict.METHOD_PARAMETERS, "accept_length")},
        "drafter": method.get("drafter"),
        "tree_build": tree_build,
        "tree_mode": mode,
        "tree_width": width,
        "verify_width": algorithm.verify_width(params),
        "sweep_size": params.get(algorithm.size),
    }


def cell_row(
    cell: dict,
    path: str,
    m: dict,
    thresholds: dict | None = None,
    versus_ar: dict | None = None,
    lossless: dict | None = None,
) -> dict:
    """A cell's row of the summary from its measures (cell_measures), its keys the summary's columns in order;
    ``final`` judged by the failure thresholds where given; ``versus_ar`` its speedup over AR's cell (metrics.speedup)
    and ``lossless`` its replies against AR's (metrics.losslessness) where they were compared. Long because it lists
    the summary's columns one a line, in order (method_columns and latency_columns hold its regular runs)."""
    c, method = cell["cell"], cell["method"]
    algorithms.get(method["algorithm"])  # a cell of an algorithm this code does not know is refused, first
    ci = m.get("output_throughput_ci") or [None, None]
    held = m.get("concurrency") or {}
    window = held.get("window")
    versus_ar = versus_ar or {"speedup": None, "speedup_ci": None, "pairs": 0}
    speedup_ci = versus_ar["speedup_ci"] or [None, None]
    lossless = lossless or {}  # not compared: NaN in its columns
    return {
        "simulated": cell["simulated"],
        "tp": c["tp"],
        "method": c["method"],
        "engine": method.get("engine") or "",
        **method_columns(method),
        "workload": c["workload"],
        "family": cell["workload"]["family"],
        "concurrency": c["concurrency"],
        "concurrency_mean": held.get("mean"),
        "concurrency_peak": held.get("peak"),
        "concurrency_steady_mean": held.get("steady_mean"),
        "concurrency_held": held.get("held"),
        "steady_window_s": window[1] - window[0] if window else None,
        "steady_share": held.get("window_share"),
        "repetition": c["repetition"],
        "launches": 1,
        "requests_sent": m["requests_sent"],
        "requests_completed": m["requests_completed"],
        "requests_failed": m["requests_failed"],
        "output_tokens": m["output_tokens"],
        "output_throughput": m["output_throughput"],
        "output_throughput_lo": ci[0],
        "output_throughput_hi": ci[1],
        "output_throughput_per_gpu": m.get("output_throughput_per_gpu"),
        "output_throughput_run": m.get("output_throughput_run"),
        "speedup": versus_ar["speedup"],
        "speedup_lo": speedup_ci[0],
        "speedup_hi": speedup_ci[1],
        "speedup_pairs": versus_ar["pairs"],
        **latency_columns(m),
        "acceptance_length": m.get("acceptance_length"),
        "acceptance_length_server": m.get("acceptance_length_server"),
        "acceptance_length_sglang": m.get("acceptance_length_sglang"),
        "tokens_per_chunk": m.get("tokens_per_chunk"),
        "acceptance_disagree": (m.get("acceptance_agreement") or {}).get("disagree"),
        "failures": "; ".join(f"{k}: {v}" for k, v in sorted(m["failures"].items())),
        "final": unfinished(cell["requests"], thresholds) is None if thresholds else None,
        "length_mismatches": m.get("length_mismatches", 0),
        "server_running_mean": m["server_load"]["running"]["mean"],
        "server_running_peak": m["server_load"]["running"]["peak"],
        "server_running_samples": m["server_load"]["running"]["samples"],
        "attention_backend": attention_backend(cell),
        "load_format": cell["provenance"].get("load_format", "auto"),
        "temperature": cell["sampling"]["temperature"],
        "finished_at": cell["provenance"]["finished_at"],
        "stream": (cell.get("load") or {}).get("stream"),
        "min_free_slots_delay": str(cell["provenance"].get("min_free_slots_delay", "sglang")),
        "content_mix": ", ".join(f"{k} {v:.0%}" for k, v in sorted(cell["workload"]["content_mix"].items())),
        # a traced workload's trace, window and time scale (a column only where a cell has one)
        **({"trace": trace_text(cell["workload"]["trace"])} if cell["workload"].get("trace") else {}),
        "sessions": cell["workload"]["sessions"],
        "precision": m["precision"],
        "precision_target": (cell.get("precision") or {}).get("target"),
        "precision_stop": (cell.get("precision") or {}).get("stopped"),
        "ttft_p99_with_failures": (m.get("ttft_with_failures") or {}).get("p99"),
        "e2e_p99_with_failures": (m.get("e2e_with_failures") or {}).get("p99"),
        "session_completion_p50": _get(m, "session_completion", "p50"),
        "lossless_compared": lossless.get("compared", math.nan),
        "lossless_exact_rate": lossless.get("exact_match_rate", math.nan),
        "lossless_first_divergence_median": lossless.get("first_divergence_median", math.nan),
        "lossless_first_divergence_min": lossless.get("first_divergence_min", math.nan),
        **slo_columns(m.get("slo") or {}),
        "cell_file": path,
    }


def attention_backend(cell: dict) -> str:
    """The attention backend a cell ran with: the server's own answer where it gave one, else the configured one."""
    info = cell["provenance"].get("server_info") or {}
    configured = cell["method"].get("attention_backend")
    return info.get("attention_backend") or configured or "server default"


# Estimates combined across launches (a Student-t interval over repetitions) and the interval columns they fill.
COMBINED = {
    "output_throughput": ("output_throughput_lo", "output_throughput_hi"),
    "speedup": ("speedup_lo", "speedup_hi"),
    "ttft_p50": ("ttft_p50_lo", "ttft_p50_hi"),
    "ttft_p99": ("ttft_p99_lo", "ttft_p99_hi"),
    "tpot_p50": ("tpot_p50_lo", "tpot_p50_hi"),
}


def combine_repetitions(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (tp, method, workload, concurrency): a single launch as it is; several launches (repetitions)
    combined, each estimate the mean over launches with a Student-t interval across them (combine_launches), counts
    summed (a gauge's mean over all its samples), other columns averaged or taken from the first launch."""
    keys = ["tp", "method", "workload", "concurrency"]
    rows = []
    for _, group in summary.groupby(keys, sort=False):
        if len(group) == 1:
            rows.append(group.iloc[0].to_dict())
            continue
        row = group.iloc[0].to_dict()
        for col in group.columns:
            if col in keys or not pd.api.types.is_numeric_dtype(group[col]) or pd.api.types.is_bool_dtype(group[col]):
                continue
            counted = col.startswith("requests_") or col == "output_tokens" or col.endswith("_samples")
            row[col] = group[col].sum() if counted else group[col].mean()
        if row["server_running_samples"]:  # the gauge's mean over every launch's samples
            row["server_running_mean"] = float(
                (group["server_running_mean"].fillna(0) * group["server_running_samples"]).sum()
                / row["server_running_samples"]
            )
        for col, (lo, hi) in COMBINED.items():
            combined = combine_launches(list(group[col]))
            ci = combined["ci"] or [None, None]
            row.update({col: combined["mean"], lo: ci[0], hi: ci[1]})
        row.update(combined_columns(group))
        if group["final"].notna().all():
            row["final"] = bool(group["final"].all())  # final only when every launch is
        row.update(repetition=None, launches=len(group), cell_file="; ".join(group["cell_file"]))
        rows.append(row)
    return pd.DataFrame(rows, columns=summary.columns).reset_index(drop=True)


class AggregateError(RuntimeError):
    """Cells that cannot be aggregated; the message names each and what to do."""


def verified_cells(
    paths: list[str], jobs: list[ServerJob], identity_digest: str | dict, failures: dict
) -> dict[str, dict]:
    """{path: cell} of the cells at these paths, each verified against the cell the configuration (its server
    ``jobs`` and the environment's identity: one digest, or {engine name: digest} where ``engines`` names several
    builds, or {external.server_key: digest} where each external server has its own) gives that path
    (cells.cell_problem) and final under the failure thresholds (cells.unfinished) unless ``failures.keep_going``;
    AggregateError naming every other cell and what to do."""
    built: dict = {}
    identity = identity_digest if isinstance(identity_digest, dict) else {None: identity_digest}
    expected = {
        os.path.normpath(c["path"]): c
        for job in jobs
        for c in keyed_cells(job, identity.get(server_key(job)) or identity[job.method.engine], built=built)[0]
    }
    cells, refused = {}, []
    for path in paths:
        want = expected.get(os.path.normpath(path))
        try:
            cell = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            refused.append(f"{path}: it cannot be read as JSON ({exc})")
            continue
        if implied.is_skipped(cell):  # not measured under budget: verdict: kept aside (skipped_cells), never a number
            if want is None or cell.get("key") != want["key"]:
                refused.append(f"{path}: a cell not measured, recorded for another configuration")
            continue
        problem = "the configuration has no such cell" if want is None else cell_problem(cell, want)
        if problem is None and not failures["keep_going"]:
            why = unfinished(cell["requests"], failures)
            problem = f"it is not final: {why} (failures.keep_going: false)" if why else None
        if problem:
            refused.append(f"{path}: {problem}")
        else:
            cells[path] = cell
    if refused:
        raise AggregateError(
            f"{len(refused)} cell(s) refused: they do not belong to the configuration being aggregated or cannot be "
            "trusted:\n  " + "\n  ".join(refused) + "\nDelete each refused cell file and run again: its server job "
            "restores it from the cell cache (after verifying it) or measures it for this configuration; a cell "
            "that is not final is measured again (or set failures.keep_going: true to aggregate it as it is)"
        )
    return cells


def trace_text(trace: dict | None) -> str:
    """A traced workload's account as the report states it: the file and format, the window and time scale, the
    requests replayed, those clipped or dropped to fit the context (and the rule) and those asking for no output
    (dropped); "" for another workload."""
    if not trace:
        return ""
    fitted = f"{trace['clipped']} clipped, {trace['dropped']} dropped over the context ({trace['over_context']})"
    if trace.get("no_output"):
        fitted += f", {trace['no_output']} asking for no output dropped"
    window = trace["window"]
    if not window.startswith("lines"):  # a window of seconds: which lines it held
        window += f", lines {trace['lines'][0]}-{trace['lines'][1]}"
    return (
        f"trace {trace['file']} ({trace['format']}), {window}: {trace['requests']} requests at the traced times, "
        f"inputs and outputs as traced (ignore_eos), text filled; {fitted}"
    )


def summarise_cells(cells: dict[str, dict], thresholds: dict | None = None, slo: Slo | None = None) -> pd.DataFrame:
    """One row per cell ({cell file: cell JSON}), every metric computed from its records (cell_measures), with
    speedup over AR at the same (engine, tp, workload, concurrency, repetition) (a cell measured under budget: verdict:
    sequential.verdict_interval, the interval valid under its stopping), with failure ``thresholds`` whether
    each is final, and with ``slo`` each objective's share, goodput and request goodput (slo.cell_measures; their
    states are slo.judge's)."""
    measures = {p: cell_measures(c) for p, c in cells.items()}
    for path, cell in cells.items():
        if slo is not None:
            window = measures[path]["concurrency"]["window"]
            measures[path]["slo"] = slo_measures(cell["requests"], slo, cell["cell"]["tp"], window, cell["seed"])
    baselines = ar_cells(cells)
    rows = []
    for path, cell in cells.items():
        base = baselines.get(path)
        versus_ar = lossless = None
        if base is not None:
            # a cell stopped under budget: verdict: the sequential interval of the look it stopped at
            versus_ar = verdict_interval(cell, cells[base]) or speedup(
                cell["requests"],
                cells[base]["requests"],
                measures[path]["concurrency"]["window"],
                measures[base]["concurrency"]["window"],
            )
            if cell["method"]["algorithm"] != algorithms.BASELINE and cell["sampling"]["temperature"] == 0:
                lossless = losslessness(cell["requests"], cells[base]["requests"])
        rows.append(cell_row(cell, path, measures[path], thresholds, versus_ar, lossless))
    frame = pd.DataFrame(rows)
    return frame.sort_values(["tp", "workload", "concurrency", "method", "repetition"]).reset_index(drop=True)


def ar_cells(cells: dict[str, dict]) -> dict[str, str]:
    """{cell file: AR's cell file at the same (engine, tp, workload, concurrency, repetition)} for every cell that
    has one (AR's own included): the cell each speedup is over."""

    def key(cell: dict) -> tuple:
        c = cell["cell"]
        return cell["method"].get("engine"), c["tp"], c["workload"], c["concurrency"], c["repetition"]

    ar = {key(c): p for p, c in cells.items() if c["method"]["algorithm"] == algorithms.BASELINE}
    return {p: ar[key(c)] for p, c in cells.items() if key(c) in ar}


ENGINE_METRICS = {"ttft": ttft, "tpot": tpot}  # medians compared across engines, beside output throughput


def engine_comparison(
    cells: dict[str, dict], order: list[str] | None = None, thresholds: dict | None = None
) -> pd.DataFrame:
    """For every (method, workload, concurrency, tp, repetition) measured on two or more engines, one row per engine
    after the reference (the first in ``order``, the configuration's, else by name): output throughput ratio =
    engine / reference (metrics.speedup: paired over the sessions both cells ran, the same prompts in the same
    order), TPOT and TTFT median ratios (metrics.median_ratio, paired by session), each with its 95% interval and
    ``differs`` where the interval excludes 1 (empty where there is no interval: nothing to say); and, at
    temperature 0, the share of the engine's replies equal to the reference's (metrics.losslessness).

    With failure ``thresholds``, ``engine_final`` and ``reference_final`` say whether each side is final
    (cells.unfinished); where either is not (kept with failures.keep_going), the row shows no ratio, no ``differs``
    and no share of equal replies, and ``reason`` says why, as it does where no session completed on both. Engines of
    one build and one setting share their cells (one cell key): where one measurement stands for both (the second
    engine's job found the first's in the cache), their row says so, and that they do not differ."""
    groups: dict[tuple, dict[str, str]] = {}
    for path, cell in cells.items():
        engine = cell["method"].get("engine")
        if engine:
            c = cell["cell"]
            base = engines.split(c["method"])[0]
            groups.setdefault((base, c["workload"], c["concurrency"], c["tp"], c["repetition"]), {})[engine] = path
    rows = []
    rank = {name: i for i, name in enumerate(order or [])}
    # rows by method, workload, then concurrency, TP and repetition as numbers (c4 before c16)
    in_order = sorted(groups.items(), key=lambda g: (*g[0][:2], g[0][2], g[0][3], -1 if g[0][4] is None else g[0][4]))
    for (base, workload, concurrency, tp, repetition), by_engine in in_order:
        names = sorted(by_engine, key=lambda e: (rank.get(e, len(rank)), e))
        reference = cells[by_engine[names[0]]]
        ref_window = cell_measures(reference)["concurrency"]["window"]
        for name in names[1:]:
            other = cells[by_engine[name]]
            row: dict = {
                "method": base,
                "workload": workload,
                "concurrency": concurrency,
                "tp": tp,
                "repetition": repetition,
                "engine": name,
                "reference": names[0],
                "simulated": bool(other["simulated"] or reference["simulated"]),
            }
            if thresholds:
                why = {side: unfinished(cells[by_engine[side]]["requests"], thresholds) for side in (name, names[0])}
                row["engine_final"], row["reference_final"] = why[name] is None, why[names[0]] is None
                if any(why.values()):
                    rows.append({**row, "reason": _not_final(why)})
                    continue
            rows.append({**row, **_paired_ratios(other, reference, ref_window)})
    return pd.DataFrame(rows, columns=ENGINE_COLUMNS)


def width_cliff(cells: dict[str, dict], thresholds: dict | None = None) -> pd.DataFrame:
    """The width cliff of tree methods sized by a node budget (DDTree): each budget's cell against the cell of the
    same configuration whose verify is the chain's width (verify width = the drafter's block size, DFlash's chain
    and the CUDA graph it captures: budget = block size - 1), at the same TP size, workload, concurrency and
    repetition. Of the same configuration: same_setting, whatever the methods' names, so a budget is never paired
    with one of another cap, block, build or flag; ``family`` names it by the reference's name less its
    ``-b<budget>`` tag. Ratios wider / chain-width of output throughput (metrics.speedup, paired over the sessions
    both ran) and of the TPOT and TTFT medians (metrics.median_ratio), each with its 95% interval and ``differs``
    where it excludes 1, as engine_comparison's rows, and each side's share of rounds on a captured CUDA graph where
    a stage profiler recorded it; with failure ``thresholds``, a pair with a cell that is not final
    (cells.unfinished) has no ratio and ``reason`` says why."""
    groups: dict[tuple, list[dict]] = {}
    for path in sorted(cells, key=lambda p: cells[p]["cell"]["method"]):
        cell = cells[path]
        params, algorithm = cell["method"].get("params") or {}, algorithms.get(cell["method"]["algorithm"])
        if algorithm.size == "budget" and "block_size" in params and params.get("budget") is not None:
            c = cell["cell"]
            groups.setdefault((c["tp"], c["workload"], c["concurrency"], c["repetition"]), []).append(cell)
    rows = []
    for (tp, workload, concurrency, repetition), group in groups.items():
        for reference in (
            c for c in group if c["method"]["params"]["block_size"] == c["method"]["params"]["budget"] + 1
        ):
            chain = int(reference["method"]["params"]["budget"])
            base, engine = engines.split(reference["cell"]["method"])
            wider: dict[int, dict] = {}  # a budget under two names: the first
            for other in group:
                budget = int(other["method"]["params"]["budget"])
                if budget > chain and same_setting(other["method"], reference["method"]):
                    wider.setdefault(budget, other)
            for budget, other in sorted(wider.items()):
                row = {
                    "tp": tp,
                    "workload": workload,
                    "concurrency": concurrency,
                    "repetition": repetition,
                    "family": engines.qualified(re.sub(r"-b\d+(?=-|$)", "", base), engine),
                    "method": other["cell"]["method"],
                    "reference": reference["cell"]["method"],
                    "budget": budget,
                    "reference_budget": chain,
                    "verify_width": budget + 1,
                    "reference_verify_width": chain + 1,
                    "cuda_graph_share": _graph_share(other),
                    "reference_cuda_graph_share": _graph_share(reference),
                    "simulated": bool(other["simulated"] or reference["simulated"]),
                }
                rows.append({**row, **_cliff_ratios(other, reference, thresholds)})
    frame = pd.DataFrame(rows, columns=WIDTH_CLIFF_COLUMNS)
    order = ["family", "tp", "workload", "concurrency", "repetition", "budget"]
    return frame.sort_values(order, kind="stable", na_position="first").reset_index(drop=True)


def _graph_share(cell: dict) -> float | None:
    """The share of a cell's profiled verify rounds that ran as a captured CUDA graph (its stage records'
    can_run_cuda_graph; None without a stage profiler)."""
    return ((cell.get("stages") or {}).get("meta") or {}).get("can_run_cuda_graph")


def _cliff_ratios(other: dict, reference: dict, thresholds: dict | None) -> dict:
    """A wider budget's cell against its chain-width budget's (width_cliff): _paired_ratios' columns, or, where
    either cell is not final under ``thresholds``, only the ``reason``."""
    if thresholds:
        why = {side["cell"]["method"]: unfinished(side["requests"], thresholds) for side in (other, reference)}
        if any(why.values()):
            return {"reason": _not_final(why)}
    ratios = _paired_ratios(other, reference, cell_measures(reference)["concurrency"]["window"], "budgets")
    return {k: v for k, v in ratios.items() if k in WIDTH_CLIFF_COLUMNS}


def same_setting(a: dict, b: dict) -> bool:
    """Whether two methods sized by a budget run the same setting but for their budgets: the same engine,
    algorithm, parameters but the budget, environment and attention backend, and flags alike token by token, a token
    either the same or the same once each side's own budget in it is read as a placeholder (the budget's value, a
    profiler's output file named by it)."""

    def less_budget(method: dict) -> dict:
        return {k: v for k, v in (method.get("params") or {}).items() if k != "budget"}

    keys = ("engine", "algorithm", "env", "attention_backend")
    if any(a.get(k) != b.get(k) for k in keys) or less_budget(a) != less_budget(b):
        return False
    flags_a, flags_b = list(a.get("flags") or []), list(b.get("flags") or [])
    budgets = str(a["params"]["budget"]), str(b["params"]["budget"])
    return len(flags_a) == len(flags_b) and all(
        x == y or str(x).replace(budgets[0], "{budget}") == str(y).replace(budgets[1], "{budget}")
        for x, y in zip(flags_a, flags_b)
    )


def _not_final(why: dict[str, str | None]) -> str:
    """The reason a pair of cells is not compared: each side that is not final ({its name: cells.unfinished's
    problem, or None}) and why."""
    return " and ".join(f"{side}'s cell is not final: {problem}" for side, problem in why.items() if problem)


def _paired_ratios(other: dict, reference: dict, ref_window, compared: str = "engines") -> dict:
    """One cell against a reference cell of the same prompts (engine_comparison: another engine's; width_cliff:
    another budget's, ``compared`` naming what differs): the ratios with their intervals and ``differs``, the pairs,
    the share of equal replies at temperature 0, and why there is no ratio where no session completed on both, or
    that one measurement stands for both engines (one cell key: they do not differ)."""
    row: dict = {}
    ratio = speedup(other["requests"], reference["requests"], cell_measures(other)["concurrency"]["window"], ref_window)
    row.update(_ratio_columns("output_throughput", ratio["speedup"], ratio["speedup_ci"]))
    row["pairs"] = ratio["pairs"]
    for metric, value in ENGINE_METRICS.items():
        sides = [
            [(value(r), r["session"], r.get("kind")) for r in cell["requests"] if r["error"] is None]
            for cell in (reference, other)
        ]
        median = median_ratio(sides[0], sides[1])
        row.update(_ratio_columns(f"{metric}_p50", median["ratio"], median["ratio_ci"]))
    flags = [row[f"{m}_differs"] for m in ("output_throughput", "tpot_p50", "ttft_p50")]
    row["differs"] = True if True in flags else None if all(f is None for f in flags) else False
    if not ratio["pairs"]:
        row["reason"] = f"no session completed on both {compared}"
    elif other["requests"] == reference["requests"]:  # one cell key, measured once, shown under both names
        row["differs"] = False
        row["reason"] = "one measurement: both engines run the same build with the same settings (one cell key)"
    same = (
        losslessness(other["requests"], reference["requests"])
        if other["sampling"]["temperature"] == 0 and reference["sampling"]["temperature"] == 0
        else {}
    )
    row["exact_match_rate"] = same.get("exact_match_rate")
    return row


BUILD_SOFTWARE = (
    "sglang",
    "sglang-kernel",
    "sgl-kernel",
    "flashinfer-python",
    "torch",
    "triton",
    "transformers",
    "cuda",
)


def engine_builds(cells: dict[str, dict], environments: dict, order: list[str]) -> pd.DataFrame:
    """What differs between the engines' builds: one row per item, one column per engine (in ``order``) and
    ``differs``: the versions their environment records give (SGLang, its kernel, FlashInfer, torch, triton,
    transformers, CUDA; the commit of a git build, else the digest of the installed wheel), then every setting a
    server reported in server_info (its flags and defaults: the single values; what it reports as lists or objects
    is its state, such as memory and counters) that is not the same on every engine for a method they share
    ("<key> (<method>)"). Empty with fewer than two engines."""
    if len(order) < 2:
        return pd.DataFrame(columns=["item", "differs"])
    rows = []
    for key in BUILD_SOFTWARE:
        values = [(environments.get(e) or {}).get("software", {}).get(key) for e in order]
        if any(v is not None for v in values):
            rows.append({"item": key, **dict(zip(order, map(_shown, values)))})
    commits = []
    for e in order:
        server = (environments.get(e) or {}).get("server", {})
        source = (server.get("source") or {}).get("archive_info", {}).get("hash")
        commits.append(server.get("commit") or source)
    rows.append({"item": "commit or wheel", **dict(zip(order, map(_shown, commits)))})
    reported: dict[str, dict[str, dict]] = {}
    for cell in cells.values():
        engine = cell["method"].get("engine")
        if engine in order:
            base = engines.split(cell["cell"]["method"])[0]
            reported.setdefault(base, {}).setdefault(engine, cell["provenance"].get("server_info") or {})
    for base, by_engine in sorted(reported.items()):
        if len(by_engine) < 2:
            continue
        settings = {k for info in by_engine.values() for k, v in info.items() if not isinstance(v, (dict, list))}
        for key in sorted(settings):
            values = [by_engine[e].get(key) if e in by_engine else None for e in order]
            if len({json.dumps(v, sort_keys=True) for e, v in zip(order, values) if e in by_engine}) > 1:
                rows.append({"item": f"{key} ({base})", **dict(zip(order, map(_shown, values)))})
    frame = pd.DataFrame(rows, columns=["item", *order])
    frame["differs"] = [len(set(row[list(order)])) > 1 for _, row in frame.iterrows()]
    return frame


def _shown(value) -> str:
    return "--" if value is None else value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _ratio_columns(name: str, ratio: float | None, ci: list | None) -> dict:
    """A ratio's columns of the engines table: the ratio, its 95% interval and whether that excludes 1 (None where
    there is no interval)."""
    if not ci:
        return {f"{name}_ratio": ratio, f"{name}_ratio_lo": None, f"{name}_ratio_hi": None, f"{name}_differs": None}
    lo, hi = ci
    return {
        f"{name}_ratio": ratio,
        f"{name}_ratio_lo": lo,
        f"{name}_ratio_hi": hi,
        f"{name}_differs": not lo <= 1 <= hi,
    }


ENGINE_COLUMNS = (
    ["method", "workload", "concurrency", "tp", "repetition", "engine", "reference", "simulated"]
    + [f"output_throughput_{k}" for k in ("ratio", "ratio_lo", "ratio_hi", "differs")]
    + ["pairs"]
    + [f"{m}_p50_{k}" for m in ENGINE_METRICS for k in ("ratio", "ratio_lo", "ratio_hi", "differs")]
    + ["differs", "exact_match_rate", "engine_final", "reference_final", "reason"]
)

WIDTH_CLIFF_COLUMNS = (
    [
        "tp",
        "workload",
        "concurrency",
        "repetition",
        "family",
        "method",
        "reference",
        "budget",
        "reference_budget",
        "verify_width",
        "reference_verify_width",
        "cuda_graph_share",
        "reference_cuda_graph_share",
        "simulated",
    ]
    + [c for c in ENGINE_COLUMNS if c.startswith(("output_throughput_", "tpot_p50_", "ttft_p50_"))]
    + [
        "pairs",
        "differs",
        "reason",
    ]
)


def request_rows(cells: dict[str, dict]) -> pd.DataFrame:
    """One row per measured request: its cell, turn, timings (s), tokens and failure category."""
    rows = []
    for cell in cells.values():
        c = cell["cell"]
        for r in cell["requests"]:
            rows.append(
                {
                    "simulated": cell["simulated"],
                    "tp": c["tp"],
                    "method": c["method"],
                    "workload": c["workload"],
                    "concurrency": c["concurrency"],
                    "repetition": c["repetition"],
                    "session": r["session"],
                    "turn": r["turn"],
                    "kind": r["kind"],
                    "error": r["error"],
                    "prompt_tokens": r["prompt_tokens"],
                    "cached_tokens": r["cached_tokens"],
                    "output_tokens": r["output_tokens"],
                    "verify_ct": r["verify_ct"],
                    "chunks": len(r["chunk_times"]),
                    "ttft": ttft(r),
                    "tpot": tpot(r),
                    "e2e": e2e(r),
                    "queue_delay": queue_delay(r),
                    "user_ttft": user_ttft(r),
                }
            )
    return pd.DataFrame(rows)


def turn_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """Per cell and turn index of multi-turn workloads: requests, TTFT/E2E medians, prompt and cached tokens, cache
    hit share."""
    keys = ["tp", "method", "workload", "concurrency", "repetition", "turn"]
    multi = requests.groupby(["tp", "method", "workload", "concurrency", "repetition"])["turn"].transform("max") > 0
    ok = requests[multi & requests["error"].isna()]
    if ok.empty:
        return pd.DataFrame(
            columns=keys
            + [
                "requests",
                "ttft_p50",
                "e2e_p50",
                "prompt_tokens_mean",
                "cached_tokens_mean",
                "cache_hit_share",
                "output_tokens_per_s",
            ]
        )
    g = ok.groupby(keys)
    out = g.agg(
        requests=("session", "size"),
        ttft_p50=("ttft", "median"),
        e2e_p50=("e2e", "median"),
        prompt_tokens_mean=("prompt_tokens", "mean"),
        cached_tokens_mean=("cached_tokens", "mean"),
        output_tokens=("output_tokens", "sum"),
        busy=("e2e", "sum"),
    ).reset_index()
    out["cache_hit_share"] = out["cached_tokens_mean"] / out["prompt_tokens_mean"]
    out["output_tokens_per_s"] = out["output_tokens"] / out["busy"]  # per request in flight
    return out.drop(columns=["output_tokens", "busy"])


BEST_COLUMNS = [
    "tp",
    "workload",
    "concurrency",
    "algorithm",
    "method",
    "sweep_size",
    "tree_mode",
    "tree_width",
    "verify_width",
    "output_throughput",
    "speedup",
]


def best_budget(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (tp, workload, concurrency) and speculative algorithm: its method (setting) with the highest output
    throughput, and its speedup."""
    spec = summary[summary["algorithm"] != algorithms.BASELINE].dropna(subset=["output_throughput"])
    if spec.empty:
        return pd.DataFrame(columns=BEST_COLUMNS)
    idx = spec.groupby(["tp", "workload", "concurrency", "algorithm"])["output_throughput"].idxmax()
    return spec.loc[idx, BEST_COLUMNS].reset_index(drop=True)


def pareto(summary: pd.DataFrame) -> pd.DataFrame:
    """Cells with interactivity (1/TPOT p50) and throughput per GPU; on_frontier marks the Pareto-optimal ones per
    workload, artefact those whose acceptance is an artefact (verdict.acceptance_artefact: forced, or dummy weights
    accepting well above 1)."""
    frame = summary.dropna(subset=["output_throughput_per_gpu", "tpot_p50"]).copy()
    frame["interactivity"] = 1.0 / frame["tpot_p50"]
    frame["artefact"] = verdict.acceptance_artefact(frame)  # a point whose acceptance is forced or dummy weights'
    frame["on_frontier"] = False
    for _, g in frame.groupby("workload"):
        for i, row in g.iterrows():
            dominated = (
                (g["interactivity"] >= row["interactivity"])
                & (g["output_throughput_per_gpu"] >= row["output_throughput_per_gpu"])
                & (
                    (g["interactivity"] > row["interactivity"])
                    | (g["output_throughput_per_gpu"] > row["output_throughput_per_gpu"])
                )
            ).any()
            frame.loc[i, "on_frontier"] = not dominated
    return frame[
        [
            "tp",
            "method",
            "workload",
            "concurrency",
            "interactivity",
            "output_throughput_per_gpu",
            "on_frontier",
            "artefact",
        ]
    ]


KIND_COLUMNS = [
    "simulated",
    "tp",
    "method",
    "algorithm",
    "workload",
    "concurrency",
    "kind",
    "sessions",
    "launches",
    "requests_completed",
    "output_throughput",
    "output_throughput_lo",
    "output_throughput_hi",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "speedup_pairs",
    "acceptance_length",
]


def _window(cell: dict) -> list[float] | None:
    """A cell's steady-state window (metrics.concurrency_report), where its throughput is measured."""
    return concurrency_report(cell["requests"], cell["cell"]["concurrency"], cell["load"]["model"])["window"]


def kind_rows(cells: dict[str, dict]) -> pd.DataFrame:
    """Per cell and content kind of its sessions (chat, code, math, json, ...): its sessions, the requests that
    completed, the kind's output throughput (metrics.kind_throughput, its 95% CI over the kind's sessions:
    metrics.throughput_ci) and speedup over AR's cell on the same sessions (metrics.speedup of the kind: the ratio of
    the two kind_throughput, paired-bootstrap CI; none below MIN_SESSIONS sessions of the kind), and the acceptance
    length of its requests (metrics.acceptance_length). One row per launch; combine_kind_launches combines them."""
    windows = {p: _window(c) for p, c in cells.items()}
    baselines = ar_cells(cells)
    rows = []
    for path, cell in cells.items():
        c, records = cell["cell"], cell["requests"]
        base = baselines.get(path)
        for kind in sorted({r["kind"] for r in records}):
            mine = of_kind(records, kind)
            versus_ar: dict = (
                speedup(records, cells[base]["requests"], windows[path], windows[base], kind=kind)
                if base is not None
                else {"speedup": None, "speedup_ci": None, "pairs": 0}
            )
            ci: list = throughput_ci(records, windows[path], cell["seed"], kind=kind) or [None, None]
            speedup_ci: list = versus_ar["speedup_ci"] or [None, None]
            rows.append(
                {
                    "simulated": cell["simulated"],
                    "tp": c["tp"],
                    "method": c["method"],
                    "algorithm": cell["method"]["algorithm"],
                    "workload": c["workload"],
                    "concurrency": c["concurrency"],
                    "repetition": c["repetition"],
                    "kind": kind,
                    "sessions": len({r["session"] for r in mine}),
                    "launches": 1,
                    "requests_completed": sum(r["error"] is None for r in mine),
                    "output_throughput": kind_throughput(records, kind, windows[path]),
                    "output_throughput_lo": ci[0],
                    "output_throughput_hi": ci[1],
                    "speedup": versus_ar["speedup"],
                    "speedup_lo": speedup_ci[0],
                    "speedup_hi": speedup_ci[1],
                    "speedup_pairs": versus_ar["pairs"],
                    "acceptance_length": acceptance_length(mine),
                }
            )
    return pd.DataFrame(rows, columns=[*KIND_COLUMNS, "repetition"])


def combine_kind_launches(kinds: pd.DataFrame) -> pd.DataFrame:
    """One row per (tp, method, workload, concurrency, kind): a single launch as it is; several launches each
    estimate the mean over launches with a Student-t interval across them (metrics.combine_launches, as
    combine_repetitions), completed requests summed, acceptance length averaged."""
    keys = ["tp", "method", "workload", "concurrency", "kind"]
    rows = []
    for _, group in kinds.groupby(keys, sort=False):
        row = group.iloc[0].to_dict()
        if len(group) > 1:
            for col in ("output_throughput", "speedup"):
                combined = combine_launches(list(group[col]))
                ci = combined["ci"] or [None, None]
                row.update({col: combined["mean"], f"{col}_lo": ci[0], f"{col}_hi": ci[1]})
            row.update(
                launches=len(group),
                requests_completed=int(group["requests_completed"].sum()),
                acceptance_length=group["acceptance_length"].mean(),
            )
        rows.append(row)
    frame = pd.DataFrame(rows, columns=KIND_COLUMNS)
    return frame.sort_values(["tp", "workload", "concurrency", "kind", "method"]).reset_index(drop=True)


ALL_KINDS = "(all)"  # the kind of acceptance_depth's rows over every session of a cell
# why a speculative cell has no acceptance per depth: its requests say whether the client looked for the rounds
NOT_REPORTED = "not reported by this build"
NOT_RECORDED = "not recorded: its client did not read the rounds yet"
DEPTH_COLUMNS = [
    "simulated",
    "tp",
    "method",
    "algorithm",
    "workload",
    "concurrency",
    "kind",
    "reported",
    "draft_depth",
    "depth",
    "acceptance",
    "conditional",
    "rounds",
    "requests_reported",
    "requests_completed",
    "note",
]


def depth_rows(cells: dict[str, dict]) -> pd.DataFrame:
    """Acceptance per draft depth of every speculative (tp, method, workload, concurrency), over all its sessions
    (kind ALL_KINDS) and each content kind's, the rounds of its launches pooled: per depth d = 1 .. D, the
    acceptance rate at d (metrics.acceptance_by_depth to the method's draft_depth) and the conditional acceptance
    (metrics.conditional_acceptance), the verify rounds they rest on and the requests that reported them; where no
    request reported its rounds, one row without a depth, ``reported`` false and a ``note``: NOT_REPORTED (the
    build reports no spec_correct_drafts_histogram) or NOT_RECORDED (a cell whose records have no such field: its
    client predates reading it)."""
    groups: dict[tuple, list[dict]] = {}
    for cell in cells.values():
        c = cell["cell"]
        groups.setdefault((c["tp"], c["method"], c["workload"], c["concurrency"]), []).append(cell)
    rows = []
    for (tp, method, workload, concurrency), group in groups.items():
        algorithm = algorithms.get(group[0]["method"]["algorithm"])
        if not algorithm.speculative:
            continue
        depth = algorithm.draft_depth(group[0]["method"]["params"])
        records = [r for cell in group for r in cell["requests"]]
        for kind in [ALL_KINDS, *sorted({r["kind"] for r in records})]:
            mine = records if kind == ALL_KINDS else of_kind(records, kind)
            common = {
                "simulated": bool(group[0]["simulated"]),
                "tp": tp,
                "method": method,
                "algorithm": algorithm.name,
                "workload": workload,
                "concurrency": concurrency,
                "kind": kind,
                "draft_depth": depth,
                "requests_reported": sum(r["error"] is None and bool(r.get("correct_drafts_histogram")) for r in mine),
                "requests_completed": sum(r["error"] is None for r in mine),
            }
            rates = acceptance_by_depth(mine, depth)
            if rates is None:
                looked = any("correct_drafts_histogram" in r for r in mine)
                rows.append({**common, "reported": False, "note": NOT_REPORTED if looked else NOT_RECORDED})
                continue
            rounds = sum(drafts_accepted(mine) or [])
            for d, (rate, conditional) in enumerate(zip(rates, conditional_acceptance(rates)), start=1):
                rows.append(
                    {
                        **common,
                        "reported": True,
                        "depth": d,
                        "acceptance": rate,
                        "conditional": conditional,
                        "rounds": rounds,
                    }
                )
    frame = pd.DataFrame(rows, columns=DEPTH_COLUMNS)
    frame = frame.astype({"depth": "Int64", "rounds": "Int64"})
    return frame.sort_values(["tp", "workload", "concurrency", "method", "kind", "depth"]).reset_index(drop=True)


def skipped_cells(paths: list[str]) -> pd.DataFrame:
    """The cells budget: verdict did not measure (their outputs are implied.skipped_record), one row each with its
    reason and the cells it is implied from (implied.SKIPPED_COLUMNS)."""
    records = {}
    for path in paths:
        try:
            cell = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # verified_cells says why
        if implied.is_skipped(cell):
            records[path] = cell
    return pd.DataFrame(implied.skipped_rows(records), columns=implied.SKIPPED_COLUMNS)


def write_tables(
    cells: dict[str, dict],
    out_dir: str | Path,
    thresholds: dict | None = None,
    engine_order: list | None = None,
    environments: dict | None = None,
    slo: Slo | None = None,
    skipped: pd.DataFrame | None = None,
    stage_costs: dict | None = None,
) -> dict[str, pd.DataFrame]:
    """All aggregated tables of these cells ({cell file: cell JSON}), each as CSV and Parquet in out_dir: summary
    (one row per launch of a cell), combined (repetitions combined), requests, turns, best_budget, break_even
    (verdict.break_even), break_even_acceptance (verdict.acceptance_break_even: the acceptance at which each family
    of forced methods breaks even with AR), pareto (the last four from combined), engines and engine_builds
    (engine_comparison, engine_builds, with the engines' environment records ``environments``; empty with one
    engine), kinds (per content kind: kind_rows, launches combined), acceptance_depth (depth_rows) and slo
    (slo.capacity: the highest concurrency meeting each of the ``slo`` objectives, none without one), skipped
    (``skipped``: skipped_cells, the cells budget: verdict did not measure), ddtree_stages
    (ddtree_profile.stage_rows: a DDTree build's stage profiler per cell, beside the cost models ``stage_costs``) and
    width_cliff (each DDTree budget against its configuration's budget of the chain's width)."""
    out_dir = Path(out_dir)
    slo = slo or Slo((), 0.9)
    summary = judge(summarise_cells(cells, thresholds, slo), slo)
    combined = judge(combine_repetitions(summary), slo)
    requests = request_rows(cells)
    tables = {
        "summary": summary,
        "combined": combined,
        "requests": requests,
        "turns": turn_rows(requests),
        "best_budget": best_budget(combined),
        "break_even": verdict.break_even(combined),
        "break_even_acceptance": verdict.acceptance_break_even(combined),
        "pareto": pareto(combined),
        "engines": engine_comparison(cells, engine_order, thresholds),
        "engine_builds": engine_builds(cells, environments or {}, list(engine_order or [])),
        "kinds": combine_kind_launches(kind_rows(cells)),
        "acceptance_depth": depth_rows(cells),
        "slo": capacity(combined, slo),
        "skipped": skipped if skipped is not None else pd.DataFrame(columns=implied.SKIPPED_COLUMNS),
        "ddtree_stages": ddtree_profile.stage_rows(cells, stage_costs),
        "width_cliff": width_cliff(cells, thresholds),
    }
    for name, frame in tables.items():
        atomic_write_text(out_dir / f"{name}.csv", frame.to_csv(index=False))
        tmp = out_dir / f".{name}.parquet.tmp"
        frame.to_parquet(tmp, index=False)
        tmp.replace(out_dir / f"{name}.parquet")
    return tables
