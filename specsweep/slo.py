"""Service-level objectives: which cells meet each configured SLO, and the highest load at which each method still
does.

The configuration's ``slo`` names one or several objectives, each with targets on TTFT, TPOT and ITL, judged per
request (metrics.slo_met, as SGLang's and vLLM's bench --goodput, GuideLLM, AIPerf and inference-perf judge them), and
the attainment a cell must show: an SLO is met in a cell where the lower bound of the 95% interval of its share of
requests meeting it (metrics.slo_attainment) is at least ``slo.attainment``, missed where the upper bound is below it,
undecided otherwise. The SLO is analysis only: no cell's key holds it, so changing it aggregates again and measures
nothing.

Per cell the summary holds, per objective, ``slo_<name>_<column>`` (COLUMNS); slo.csv holds per TP, workload, method
and objective the highest concurrency measured at which it is met (capacity).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .metrics import combine_launches, slo_measures, wilson_interval

TARGETS = ("ttft_ms", "tpot_ms", "itl_ms")  # the targets an objective may set, in milliseconds
TARGET_LABELS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL"}
# an objective's columns in the summary, each "slo_<name>_<column>"
COLUMNS = (
    "share",
    "share_lo",
    "share_hi",
    "met",
    "effective",
    "goodput",
    "goodput_lo",
    "goodput_hi",
    "goodput_per_gpu",
    "request_goodput",
    "state",
)
STATES = ("met", "undecided", "missed")


@dataclass(frozen=True)
class Objective:
    """One named SLO: its targets in milliseconds (None where it sets none)."""

    name: str
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None

    @property
    def targets(self) -> dict:
        """{"ttft_ms": ..., "tpot_ms": ..., "itl_ms": ...}, as metrics.slo_met takes them."""
        return {key: getattr(self, key) for key in TARGETS}

    def text(self) -> str:
        """Its targets as a reader reads them: "TTFT <= 2000 ms, TPOT <= 50 ms"."""
        return ", ".join(f"{TARGET_LABELS[k]} <= {v:g} ms" for k, v in self.targets.items() if v is not None)


@dataclass(frozen=True)
class Slo:
    """The configuration's ``slo``: its objectives and the attainment a cell must show to meet one."""

    objectives: tuple[Objective, ...]
    attainment: float

    @classmethod
    def from_config(cls, section: dict) -> "Slo":
        """From the validated configuration's ``slo`` block (defaults filled)."""
        objectives = tuple(
            Objective(o["name"], **{k: (float(o[k]) if o.get(k) is not None else None) for k in TARGETS})
            for o in section.get("objectives", [])
        )
        return cls(objectives, float(section.get("attainment", 0.9)))


def column(name: str, what: str) -> str:
    """An objective's column in the summary: slo_<name>_<what>."""
    return f"slo_{name}_{what}"


def names_in(frame: pd.DataFrame) -> list[str]:
    """The objectives a summary has columns for, in its column order."""
    return [c[len("slo_") : -len("_share")] for c in frame.columns if c.startswith("slo_") and c.endswith("_share")]


def cell_measures(records: list[dict], slo: Slo, tp: int, window: list[float] | None, seed: int = 0) -> dict:
    """{objective name: metrics.slo_measures} of one cell's measured requests."""
    return {o.name: slo_measures(records, o.targets, tp, window, seed) for o in slo.objectives}


def cell_columns(measures: dict) -> dict:
    """A cell's SLO columns of the summary from its cell_measures (the state is judge's)."""
    out: dict = {}
    for name, m in measures.items():
        share_ci = m["share_ci"] or [None, None]
        goodput_ci = m["goodput_ci"] or [None, None]
        values = {
            "share": m["share"],
            "share_lo": share_ci[0],
            "share_hi": share_ci[1],
            "met": m["met"],
            "effective": m["effective"],
            "goodput": m["goodput"],
            "goodput_lo": goodput_ci[0],
            "goodput_hi": goodput_ci[1],
            "goodput_per_gpu": m["goodput_per_gpu"],
            "request_goodput": m["request_goodput"],
            "state": None,
        }
        out.update({column(name, k): v for k, v in values.items()})
    return out


def combined_columns(group: pd.DataFrame) -> dict:
    """Several launches of one cell, per objective: the share pooled (requests met over requests sent in all), its
    interval the hull of the Student-t interval across the launches' shares (combine_launches: their spread) and the
    Wilson interval of the pooled share at the launches' mean effective number of requests (metrics.slo_attainment:
    they ran the same prompts, so a launch more is not more of them); goodput the mean over launches with its
    Student-t interval, as throughput is combined; requests met summed."""
    out: dict = {}
    names = names_in(group)
    if not names:  # no objective judged: nothing to pool (and a summary without SLOs needs no request counts)
        return out
    sent = group["requests_sent"].sum()
    for name in names:
        met = group[column(name, "met")].sum()
        share = met / sent if sent else None
        effective = float(group[column(name, "effective")].mean())
        wilson = wilson_interval(share, effective) if share is not None else None
        across = combine_launches(list(group[column(name, "share")]))["ci"]
        if wilson and across:
            wilson = [max(0.0, min(wilson[0], across[0])), min(1.0, max(wilson[1], across[1]))]
        ci: list = wilson or [None, None]
        goodput = combine_launches(list(group[column(name, "goodput")]))
        goodput_ci = goodput["ci"] or [None, None]
        out.update(
            {
                column(name, "met"): met,
                column(name, "share"): share,
                column(name, "share_lo"): ci[0],
                column(name, "share_hi"): ci[1],
                column(name, "effective"): effective,
                column(name, "goodput"): goodput["mean"],
                column(name, "goodput_lo"): goodput_ci[0],
                column(name, "goodput_hi"): goodput_ci[1],
            }
        )
    return out


def state(lo, hi, attainment: float) -> str:
    """met where the share's interval lies at or above the attainment (its lower bound >= it), missed where it lies
    below (its upper bound < it), undecided where it holds the attainment or there is none."""
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return "undecided"
    return "met" if lo >= attainment else "missed" if hi < attainment else "undecided"


def judge(frame: pd.DataFrame, slo: Slo) -> pd.DataFrame:
    """The summary with each objective's state column filled (state, at the configured attainment)."""
    frame = frame.copy()
    for name in names_in(frame):
        frame[column(name, "state")] = [
            state(lo, hi, slo.attainment)
            for lo, hi in zip(frame[column(name, "share_lo")], frame[column(name, "share_hi")])
        ]
    return frame


CAPACITY_COLUMNS = [
    "tp",
    "workload",
    "method",
    "slo",
    "targets",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "attainment",
    "highest_concurrency",
    "output_throughput_per_gpu",
    "goodput_per_gpu",
    "share",
    "share_lo",
    "share_hi",
    "levels",
    "simulated",
]


def capacity(combined: pd.DataFrame, slo: Slo) -> pd.DataFrame:
    """Per TP, workload, method and objective: the highest concurrency measured at which the objective is met (its
    share's lower bound at least the attainment), with the output throughput per GPU, the goodput per GPU and the
    share (with its interval) there, empty where it is met at none; and ``levels``, each concurrency measured with
    its state ("1 met; 4 met; 16 undecided")."""
    rows = []
    present = set(names_in(combined))
    for objective in (o for o in slo.objectives if o.name in present):
        state_col = column(objective.name, "state")
        for (tp, workload, method), group in combined.groupby(["tp", "workload", "method"], sort=False):
            group = group.sort_values("concurrency")
            met = group[group[state_col] == "met"]
            top = met.iloc[-1] if len(met) else None
            rows.append(
                {
                    "tp": tp,
                    "workload": workload,
                    "method": method,
                    "slo": objective.name,
                    "targets": objective.text(),
                    **objective.targets,
                    "attainment": slo.attainment,
                    "highest_concurrency": int(top["concurrency"]) if top is not None else None,
                    "output_throughput_per_gpu": top["output_throughput_per_gpu"] if top is not None else None,
                    "goodput_per_gpu": top[column(objective.name, "goodput_per_gpu")] if top is not None else None,
                    "share": top[column(objective.name, "share")] if top is not None else None,
                    "share_lo": top[column(objective.name, "share_lo")] if top is not None else None,
                    "share_hi": top[column(objective.name, "share_hi")] if top is not None else None,
                    "levels": "; ".join(f"{int(c)} {s}" for c, s in zip(group["concurrency"], group[state_col])),
                    "simulated": bool(group["simulated"].any()),
                }
            )
    frame = pd.DataFrame(rows, columns=CAPACITY_COLUMNS)
    frame["highest_concurrency"] = frame["highest_concurrency"].astype("Int64")
    return frame


def cell_states(combined: pd.DataFrame) -> dict[tuple, dict[str, str]]:
    """{(tp, workload, concurrency, method): {objective name: "met", "missed" or "undecided"}} of combined.csv (its
    judged state columns): whether each SLO is met in each cell, for a table that shows it beside other figures."""
    names = names_in(combined)
    return {
        (row["tp"], row["workload"], row["concurrency"], row["method"]): {
            name: str(row[column(name, "state")]) for name in names
        }
        for row in combined.to_dict("records")
    }
