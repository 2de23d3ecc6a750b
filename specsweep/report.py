"""The report: one CSV per chart and table, the LaTeX document (pgfplots), its PDF, and matplotlib figures.

Every number shown comes from the aggregated tables (results/*.csv) through
the CSV files written here; the .tex only names columns. The same figure
specifications drive the pgfplots charts of the PDF and the matplotlib
figures of Snakemake's HTML report.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import jinja2
import pandas as pd

from . import __version__, algorithms
from .cache import read_run_records
from .canon import atomic_write_text
from .layout import REPORT_SECTIONS as SECTIONS
from .metrics import BOOTSTRAP_RESAMPLES, MIN_SESSIONS, definitions, statistics

TEX_MISSING = (
    "latexmk or pdflatex was not found. Install TeX Live: "
    "sudo apt-get install texlive-latex-base texlive-latex-recommended texlive-pictures "
    "texlive-science lmodern latexmk (or run the README's set-up command tools/setup.sh)."
)
COLORS = ["blue", "red", "green!60!black", "orange", "violet", "cyan", "brown", "magenta", "gray", "teal"]
LEGEND_CHARACTERS = 90  # characters of legend entries (with their marks) that fit across a chart
CHART_WIDTH_CM = 14  # a chart's axis, where its tick labels go (0.9 of the text block)
MPL_COLORS = [
    "#1f3fbf",
    "#bf1f1f",
    "#2e8b2e",
    "#e08000",
    "#8a2be2",
    "#008b8b",
    "#8b4513",
    "#c71585",
    "#666666",
    "#006d6d",
]


class ReportError(RuntimeError):
    pass


PACKAGE_DIR = Path(__file__).resolve().parent


def renderer_stamp(package_dir: Path = PACKAGE_DIR) -> str:
    """Which code rendered a report, as every PDF prints it: specsweep's version and the commit of the git checkout
    the package is imported from (``git describe --always``), with "uncommitted changes" where the package's files
    (specsweep/, its templates included) differ from that commit; the version alone, said so, where the package is
    not a checkout's (an installed copy, or a tree copied without its history)."""

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(package_dir.parent), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != package_dir.parent.resolve():  # e.g. a copy inside another repository
        return f"specsweep {__version__} (not a git checkout: commit unknown)"
    commit = git("describe", "--always", "--abbrev=12")
    dirty = git("status", "--porcelain", "--", package_dir.name)
    stamp = f"specsweep {__version__}, commit {commit}"
    if dirty is None:
        return f"{stamp} (whether it has uncommitted changes is unknown)"
    return f"{stamp} with uncommitted changes" if dirty else stamp


TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
NAME_BREAKS = "./:"  # a name may break after each of these, after an underscore (tex_escape) and a hyphen (TeX)
NAME_RUN = 12  # and, where it must, within every run of more than this many characters without one


def tex_escape(text) -> str:
    """Text for LaTeX, its special characters escaped; a break allowed after each underscore."""
    return "".join(TEX_SPECIAL.get(ch, ch) + (r"\allowbreak{}" if ch == "_" else "") for ch in str(text))


def tex_name(text) -> str:
    """A name from the configuration (method, workload, server, drafter) for LaTeX: escaped, with a place to break
    after each of NAME_BREAKS and, at a cost that makes a line break at a space or a hyphen rather than there,
    within every run of more than NAME_RUN characters without one, so that a table's column or a line of any width
    holds it; '--' stays two hyphens (no en dash). Short words joined by hyphens stay as written."""
    out = []
    for part in re.split(f"([-_ {re.escape(NAME_BREAKS)}])", str(text)):
        if len(part) == 1 and part in NAME_BREAKS:
            out.append(part + r"\allowbreak{}")
        else:
            out.append(r"\penalty200{}".join(tex_escape(part[i : i + NAME_RUN]) for i in range(0, len(part), NAME_RUN)))
    return "".join(out).replace("--", "-{}-").replace("--", "-{}-")


def _wide(
    frame: pd.DataFrame, series: list[str], series_col: str, x: str, y: str, lo: str | None, hi: str | None
) -> pd.DataFrame:
    """One row per x; per series i: s<i>, s<i>_plus, s<i>_minus (error bar lengths, 0 without a CI)."""
    out = pd.DataFrame({x: sorted(frame[x].dropna().unique())})
    twice = frame[frame.duplicated([series_col, x], keep=False)]
    if len(twice):  # a point is one measurement: never the mean of two methods or cells
        raise ReportError(
            f"chart of {y} against {x}: series {twice[series_col].iloc[0]!r} has "
            f"{len(twice)} rows for one point ({x} = {twice[x].iloc[0]})"
        )
    for i, name in enumerate(series):
        sub = frame[frame[series_col] == name].groupby(x)
        mean = sub[y].mean()
        out[f"s{i}"] = out[x].map(mean)
        out[f"s{i}_plus"] = out[x].map(sub[hi].mean() - mean).clip(lower=0).fillna(0) if hi else 0.0
        out[f"s{i}_minus"] = out[x].map(mean - sub[lo].mean()).clip(lower=0).fillna(0) if lo else 0.0
    return out


class Figures:
    """Collects figure specifications and the CSV text each one draws (in ``data``, by file name)."""

    def __init__(self, data: dict[str, str], methods: list[str]):
        self.data, self.methods = data, methods
        self.specs: list[dict] = []

    def _series(self, frame, col):
        present = set(frame[col])
        order = [m for m in self.methods if m in present] if col == "method" else sorted(present, key=str)
        return order

    def line(
        self,
        section,
        fid,
        frame,
        x,
        y,
        lo,
        hi,
        xlabel,
        ylabel,
        caption,
        series_col="method",
        logx=False,
        reference=None,
    ):
        frame = frame.dropna(subset=[y])
        if frame.empty or frame[x].nunique() < 2:
            return
        series = self._series(frame, series_col)
        wide = _wide(frame, series, series_col, x, y, lo, hi)
        self._add(section, fid, "line", wide, x, xlabel, ylabel, caption, series, logx=logx, reference=reference)

    def bars(self, section, fid, frame, x, y, lo, hi, xlabel, ylabel, caption, series_col="method", baseline=None):
        frame = frame.dropna(subset=[y])
        if frame.empty:
            return
        labels = list(dict.fromkeys(frame[x]))
        frame = frame.assign(_x=frame[x].map({v: i for i, v in enumerate(labels)}))
        series = self._series(frame, series_col)
        wide = _wide(frame, series, series_col, "_x", y, lo, hi).rename(columns={"_x": "x"})
        self._add(
            section,
            fid,
            "bar",
            wide,
            "x",
            xlabel,
            ylabel,
            caption,
            series,
            xlabels=[str(v) for v in labels],
            baseline=baseline,
        )

    def scatter(self, section, fid, frame, x, y, xlabel, ylabel, caption, series_col="method"):
        """Points per series (columns x<i>, y<i>), plus the Pareto-frontier points (fx, fy)."""
        frame = frame.dropna(subset=[x, y])
        if frame.empty:
            return
        series = self._series(frame, series_col)
        columns = {}
        for i, name in enumerate(series):
            sub = frame[frame[series_col] == name]
            columns[f"x{i}"], columns[f"y{i}"] = list(sub[x]), list(sub[y])
        front = frame[frame["on_frontier"]].sort_values(x) if "on_frontier" in frame else frame.iloc[0:0]
        columns["fx"], columns["fy"] = list(front[x]), list(front[y])
        wide = pd.DataFrame({k: pd.Series(v, dtype=float) for k, v in columns.items()})
        self._add(section, fid, "scatter", wide, "x0", xlabel, ylabel, caption, series)

    def _add(self, section, fid, kind, wide, x, xlabel, ylabel, caption, series, **extra):
        name = f"{fid}.csv"
        self.data[name] = wide.to_csv(index=False, na_rep="nan")
        spec = {
            "section": section,
            "id": fid,
            "kind": kind,
            "csv": f"data/{name}",
            "x": x,
            "xlabel": xlabel,
            "ylabel": ylabel,
            "caption": caption,
            "labels": series,
            "series": [
                {"col": f"s{i}", "label": tex_escape(s), "color": COLORS[i % len(COLORS)], "index": i}
                for i, s in enumerate(series)
            ],
            **extra,
        }
        if kind == "line":
            spec["xticks"] = ",".join(f"{v:g}" for v in wide[x])
        if kind == "bar":
            spec["xticks"] = ",".join(str(i) for i in range(len(extra["xlabels"])))
            spec["xlabels_tex"] = ",".join(r"{\hspace{0pt}" + tex_name(v) + "}" for v in extra["xlabels"])  # may break
            spec["bar_width"] = max(3, min(14, int(260 / max(1, len(series) * len(extra["xlabels"])))))
            spec["xlabel_width_cm"] = round(0.8 * CHART_WIDTH_CM / len(extra["xlabels"]), 2)  # a long name wraps
        entries = [str(s) for s in series] + [r["text"] for r in extra.get("reference") or []]
        entries += ["Pareto frontier"] if kind == "scatter" else []
        spec["legend_columns"] = max(1, min(4, LEGEND_CHARACTERS // (max(map(len, entries)) + 6)))
        self.specs.append(spec)


def _table(frame: pd.DataFrame, data: dict[str, str], name: str, string_cols=()) -> bool:
    """Put a table's CSV text in ``data`` under ``name`` (text columns escaped for LaTeX, commas made semicolons:
    pgfplotstable reads no quoted fields); True when it has rows."""
    for col in (c for c in string_cols if c in frame):
        frame = frame.assign(**{col: frame[col].map(lambda v: tex_name(v).replace(",", ";"))})
    data[name] = frame.to_csv(index=False)
    return not frame.empty


@dataclass
class Tables:
    """The aggregated tables the report reads, and the facts every section uses."""

    summary: pd.DataFrame  # combined.csv: one row per cell, repetitions combined across launches
    turns: pd.DataFrame
    best: pd.DataFrame
    breakeven: pd.DataFrame
    pareto: pd.DataFrame

    @classmethod
    def read(cls, tables_dir: str | Path) -> "Tables":
        tables_dir = Path(tables_dir)
        return cls(
            *(
                pd.read_csv(tables_dir / f"{name}.csv")
                for name in ("combined", "turns", "best_budget", "break_even", "pareto")
            )
        )

    @property
    def tps(self) -> list:
        return sorted(self.summary["tp"].unique())

    @property
    def lowest(self) -> int:
        """The lowest concurrency measured (the single-stream figures')."""
        return int(self.summary["concurrency"].min())

    @property
    def low(self) -> pd.DataFrame:
        return self.summary[self.summary["concurrency"] == self.lowest]


def single_stream(t: Tables, figs: Figures) -> dict:
    """Section 2: tokens/s and speedup per workload at the lowest concurrency."""
    low, tps, lowest = t.low, t.tps, t.lowest
    n_req = int(t.summary["requests_sent"].max()) if len(t.summary) else 0
    for tp in tps:
        sub = low[low["tp"] == tp]
        figs.bars(
            "single",
            f"single-throughput-tp{tp}",
            sub,
            "workload",
            "output_throughput",
            "output_throughput_lo",
            "output_throughput_hi",
            "Workload",
            "Output throughput (tokens/s)",
            f"Output throughput at concurrency {lowest}, TP {tp}, per workload and method "
            f"(up to {n_req} measured requests per cell; error bars: 95\\% bootstrap CI).",
        )
        spec = sub[sub["algorithm"] != algorithms.BASELINE]
        figs.bars(
            "single",
            f"single-speedup-tp{tp}",
            spec,
            "workload",
            "speedup",
            "speedup_lo",
            "speedup_hi",
            "Workload",
            "Speedup over AR",
            f"Speedup in output throughput over AR at concurrency {lowest}, TP {tp} (same prompts in the same "
            "order; error bars: 95\\% paired-bootstrap CI; dashed line: no speedup).",
            baseline=1,
        )
    return {}


def budget_sweep(t: Tables, figs: Figures, data: dict[str, str]) -> dict:
    """Section 3: for every speculative algorithm measured at two or more settings of its size (the registry's
    ``size``: DDTree's budget, NGRAM's and draft models' num_draft_tokens, DFlash's block), acceptance and
    throughput against that size, each point marked with the shape it verifies (a chain, or a tree of some
    width), DFlash as the reference line of the others; and the table of what every speculative method verifies."""
    summary, low, tps, lowest = t.summary, t.low, t.tps, t.lowest
    spec = low[low["algorithm"] != algorithms.BASELINE].dropna(subset=["sweep_size"])
    spec = spec.assign(series=_sweep_series(spec))
    has_modes = _modes_table(spec, data)
    chain = low[low["algorithm"].isin([a.name for a in algorithms.REGISTRY.values() if a.reference])]
    for name in spec["algorithm"].unique():
        algorithm = algorithms.get(name)
        axis = SIZE_LABELS.get(algorithm.size or "", algorithm.size or "")  # one with sweep sizes has a size
        for tp in tps:
            for workload in summary["workload"].unique():
                sub = spec[(spec["algorithm"] == name) & (spec["tp"] == tp) & (spec["workload"] == workload)]
                if sub["sweep_size"].nunique() < 2:
                    continue
                c = (
                    chain[(chain["tp"] == tp) & (chain["workload"] == workload)]
                    if not algorithm.reference
                    else chain[0:0]
                )
                refs = {col: _references(c, col) for col in ("acceptance_length", "output_throughput")}
                where = f"{algorithm.title}, workload {tex_name(workload)}, TP {tp}, concurrency {lowest}"
                figs.line(
                    "budget",
                    f"sweep-{name}-acceptance-{workload}-tp{tp}",
                    sub,
                    "sweep_size",
                    "acceptance_length",
                    None,
                    None,
                    axis,
                    "Acceptance length (tokens per round)",
                    f"Acceptance length against the {axis.lower()}, {where}; marks: the shape each setting "
                    "verifies (chain or tree, widths in the table of modes)"
                    + ("; horizontal line: DFlash (linear chain)." if refs["acceptance_length"] else "."),
                    series_col="series",
                    logx=True,
                    reference=refs["acceptance_length"],
                )
                figs.line(
                    "budget",
                    f"sweep-{name}-throughput-{workload}-tp{tp}",
                    sub,
                    "sweep_size",
                    "output_throughput",
                    "output_throughput_lo",
                    "output_throughput_hi",
                    axis,
                    "Output throughput (tokens/s)",
                    f"Output throughput against the {axis.lower()}, {where} (error bars: 95\\% CI); marks: "
                    "the shape each setting verifies"
                    + ("; horizontal line: DFlash." if refs["output_throughput"] else "."),
                    series_col="series",
                    logx=True,
                    reference=refs["output_throughput"],
                )
    return {"has_modes": has_modes}


def _modes_table(spec: pd.DataFrame, data: dict[str, str]) -> bool:
    """The table of what every speculative method verifies (its build, size, width cap, mode, width, tokens a
    round); whether it has any row."""
    modes = spec.drop_duplicates("method")[
        ["method", "algorithm", "tree_build", "sweep_size", "topk", "tree_mode", "tree_width", "verify_width"]
    ].sort_values(["algorithm", "sweep_size"])
    modes = modes.assign(
        tree_build=modes["tree_build"].fillna("--"),
        **{c: modes[c].astype("Int64") for c in ("sweep_size", "topk", "tree_width", "verify_width")},
    )
    return _table(modes, data, "modes.csv", ["method", "algorithm", "tree_build", "tree_mode"])


def _references(chain: pd.DataFrame, column: str) -> list[dict]:
    """A sweep chart's horizontal lines: each DFlash method's value of ``column`` in these rows."""
    return [
        {"label": f"DFlash {tex_escape(m)}", "text": f"DFlash {m}", "value": float(v)}
        for m, v in zip(chain["method"], chain[column])
        if pd.notna(v)
    ]


def _sweep_series(spec: pd.DataFrame) -> list[str]:
    """Each speculative row's series in the sweep charts: its algorithm's title and the shape it verifies, plus
    every other parameter (and the drafter) that differs between that algorithm's methods, and the method's name
    where two methods would still meet at one point: a point is one method's."""
    labels = pd.Series("", index=spec.index)
    for name, group in spec.groupby("algorithm"):
        algorithm = algorithms.get(str(name))
        others = [
            p.name
            for p in algorithm.parameters
            if p.name != algorithm.size and p.name in group and group[p.name].nunique(dropna=False) > 1
        ]
        others += ["drafter"] if "drafter" in group and group["drafter"].nunique(dropna=False) > 1 else []
        for i, row in group.iterrows():
            labels.at[i] = f"{algorithm.title}, {row['tree_mode']}" + "".join(f", {k} {row[k]}" for k in others)
    keys = pd.DataFrame({"label": labels, "x": spec["sweep_size"], "tp": spec["tp"], "workload": spec["workload"]})
    clash = keys.duplicated(keep=False)
    return [f"{label} ({method})" if c else label for label, method, c in zip(labels, spec["method"], clash)]


# the axis of a sweep chart, by the registry's size parameter
SIZE_LABELS = {
    "budget": "Node budget",
    "num_draft_tokens": "Draft tokens verified per request",
    "block_size": "Block size",
}


def tensor_parallelism(t: Tables, figs: Figures, data: dict[str, str]) -> dict:
    """Section 4: throughput per TP size and the scaling efficiency against the smallest."""
    summary, low, tps, lowest = t.summary, t.low, t.tps, t.lowest
    scaling = pd.DataFrame()
    if len(tps) > 1:
        for workload in summary["workload"].unique():
            sub = low[low["workload"] == workload].sort_values("tp")
            figs.bars(
                "tp",
                f"tp-throughput-{workload}",
                sub.assign(tp_label=sub["tp"].map(lambda v: f"TP {v}")),
                "tp_label",
                "output_throughput",
                "output_throughput_lo",
                "output_throughput_hi",
                "Tensor-parallel size",
                "Output throughput (tokens/s)",
                f"Output throughput per TP size and method, workload {tex_name(workload)}, concurrency {lowest} "
                "(error bars: 95\\% CI).",
            )
        base = low[low["tp"] == tps[0]].set_index(["method", "workload"])["output_throughput"]
        scaling = low[["tp", "method", "workload", "output_throughput"]].copy()
        scaling["scaling_efficiency"] = [
            row.output_throughput / (base.get((row.method, row.workload), float("nan")) * row.tp / tps[0])
            for row in scaling.itertuples()
        ]
    has_tp = _table(scaling, data, "scaling.csv", ["method", "workload"]) and len(tps) > 1
    return {"has_tp": has_tp}


def concurrency(t: Tables, figs: Figures, data: dict[str, str]) -> dict:
    """Section 5: throughput, TTFT and TPOT against concurrency, the Pareto frontier, break-even and best
    budgets."""
    summary, pareto, tps = t.summary, t.pareto, t.tps
    for tp in tps:
        for workload in summary["workload"].unique():
            sub = summary[(summary["tp"] == tp) & (summary["workload"] == workload)]
            _concurrency_charts(figs, sub, workload, tp)
    for workload in pareto["workload"].unique():
        figs.scatter(
            "concurrency",
            f"pareto-{workload}",
            pareto[pareto["workload"] == workload],
            "interactivity",
            "output_throughput_per_gpu",
            "Interactivity (tokens/s per user)",
            "Output throughput per GPU (tokens/s)",
            f"Throughput per GPU against interactivity (1/TPOT p50), workload {tex_name(workload)}, every "
            "TP size and concurrency; circled points joined by a dotted line form the Pareto frontier.",
        )
    has_break_even = _table(t.breakeven, data, "break_even.csv", ["method", "workload"])
    has_best = _table(t.best, data, "best_budget.csv", ["method", "workload", "algorithm"])
    return {"has_break_even": has_break_even, "has_best": has_best}


def _concurrency_charts(figs: Figures, sub: pd.DataFrame, workload: str, tp: int) -> None:
    """One workload's and TP size's charts against concurrency: output throughput, TTFT p99 and TPOT p50, each with
    its 95% interval."""
    label = f"workload {tex_name(workload)}, TP {tp}"
    figs.line(
        "concurrency",
        f"conc-throughput-{workload}-tp{tp}",
        sub,
        "concurrency",
        "output_throughput",
        "output_throughput_lo",
        "output_throughput_hi",
        "Concurrency (requests in flight)",
        "Output throughput (tokens/s)",
        f"Output throughput against concurrency, {label} (error bars: 95\\% CI).",
        logx=True,
    )
    figs.line(
        "concurrency",
        f"conc-ttft-{workload}-tp{tp}",
        sub.assign(v=sub["ttft_p99"] * 1000, lo=sub["ttft_p99_lo"] * 1000, hi=sub["ttft_p99_hi"] * 1000),
        "concurrency",
        "v",
        "lo",
        "hi",
        "Concurrency",
        "TTFT p99 (ms)",
        f"Time to first token, 99th percentile, {label} (error bars: 95\\% CI).",
        logx=True,
    )
    figs.line(
        "concurrency",
        f"conc-tpot-{workload}-tp{tp}",
        sub.assign(v=sub["tpot_p50"] * 1000, lo=sub["tpot_p50_lo"] * 1000, hi=sub["tpot_p50_hi"] * 1000),
        "concurrency",
        "v",
        "lo",
        "hi",
        "Concurrency",
        "TPOT p50 (ms)",
        f"Time per output token, median, {label} (error bars: 95\\% CI).",
        logx=True,
    )


def _with_interval(ratio, lo, hi) -> str:
    """A ratio over its 95% interval as the engines table prints them (TeX, two lines in one cell, so that the table
    fits the page): "1.120" over "[1.080; 1.160]", [--] where it has no interval, -- where there is no ratio."""
    if ratio is None or pd.isna(ratio):
        return "--"
    interval = "[--]" if lo is None or pd.isna(lo) or hi is None or pd.isna(hi) else f"[{lo:.3f}; {hi:.3f}]"
    return rf"\twolines{{{ratio:.3f}}}{{{interval}}}"


def _differs(value) -> str:
    """The engines table's differs column as printed: yes, no, or -- where nothing was compared."""
    return "--" if pd.isna(value) else "yes" if str(value) == "True" else "no"


def engines_section(tables_dir: str | Path, data: dict[str, str]) -> dict:
    """Section: each cell on an engine against the same cell on the reference engine (aggregate.engine_comparison),
    where the configuration has two or more engines; a row not compared (a side not final, no session completed
    on both), or one that is one measurement under two names (engines of one build and settings), is marked with the
    number of its reason, and the reasons are listed under the table."""
    path = Path(tables_dir) / "engines.csv"
    frame = pd.read_csv(path) if path.exists() and path.stat().st_size else pd.DataFrame()
    if frame.empty:
        return {"has_engines": False}
    reasons = list(dict.fromkeys(frame["reason"].dropna()))  # each once, numbered in the order of the rows
    shown = pd.DataFrame(
        {
            "tp": frame["tp"],
            "method": frame["method"],
            "workload": frame["workload"],
            "concurrency": frame["concurrency"],
            "engine": frame["engine"],
            "reference": frame["reference"],
            **{
                label: [
                    _with_interval(*values)
                    for values in zip(frame[f"{m}_ratio"], frame[f"{m}_ratio_lo"], frame[f"{m}_ratio_hi"])
                ]
                for label, m in (("throughput", "output_throughput"), ("tpot", "tpot_p50"), ("ttft", "ttft_p50"))
            },
            "differs": [_differs(v) for v in frame["differs"]],
            "same_replies": ["--" if pd.isna(v) else f"{100 * v:.0f}\\%" for v in frame["exact_match_rate"]],
            "note": ["" if pd.isna(r) else f"({reasons.index(r) + 1})" for r in frame["reason"]],
        }
    )
    _table(shown, data, "engines.csv", ["method", "workload", "engine", "reference"])
    builds_path = Path(tables_dir) / "engine_builds.csv"
    builds = pd.read_csv(builds_path, dtype=str, keep_default_na=False) if builds_path.exists() else pd.DataFrame()
    if not builds.empty:
        builds["differs"] = ["yes" if v == "True" else "no" for v in builds["differs"]]
    _table(builds, data, "engine_builds.csv", list(builds.columns))
    return {
        "has_engines": True,
        "engines_differ": sum(_differs(v) == "yes" for v in frame["differs"]),
        "engines_not_compared": int(frame["output_throughput_ratio"].isna().sum()),
        "engines_one_measurement": sum(isinstance(r, str) and r.startswith("one measurement") for r in frame["reason"]),
        "engine_notes": "; ".join(f"({i}) {tex_escape(r)}" for i, r in enumerate(reasons, 1)),
        "has_engine_builds": not builds.empty,
        # each column's width, a share of the line: a long value (a wheel's digest) wraps within its column
        "engine_builds_width": round(0.85 / max(1, len(builds.columns)), 3),
    }


def agentic(t: Tables, figs: Figures, data: dict[str, str]) -> dict:
    """Section 6: TTFT and prefix-cache hits per turn, session completion."""
    summary, turns, tps, lowest = t.summary, t.turns, t.tps, t.lowest
    agentic_workloads = list(turns["workload"].unique()) if len(turns) else []
    for workload in agentic_workloads:
        for tp in tps:
            sub = turns[(turns["workload"] == workload) & (turns["tp"] == tp) & (turns["concurrency"] == lowest)]
            figs.line(
                "agentic",
                f"turn-ttft-{workload}-tp{tp}",
                sub.assign(v=sub["ttft_p50"] * 1000),
                "turn",
                "v",
                None,
                None,
                "Turn",
                "TTFT p50 (ms)",
                f"Time to first token per turn, workload {tex_name(workload)}, TP {tp}, concurrency {lowest}.",
            )
            figs.line(
                "agentic",
                f"turn-cache-{workload}-tp{tp}",
                sub.assign(v=sub["cache_hit_share"] * 100),
                "turn",
                "v",
                None,
                None,
                "Turn",
                "Prompt tokens from the prefix cache (\\%)",
                f"Prefix-cache hits per turn, workload {tex_name(workload)}, TP {tp}, concurrency {lowest}.",
            )
    sessions = summary[summary["workload"].isin(agentic_workloads)][
        ["tp", "method", "workload", "concurrency", "session_completion_p50", "output_throughput"]
    ]
    has_sessions = _table(sessions, data, "sessions.csv", ["method", "workload"])
    return {"has_sessions": has_sessions}


def setup_tables(t: Tables, environment: dict, view: dict, simulated: bool, data: dict[str, str]) -> dict:
    """Section 1 and the appendix: provenance, workloads, acceptance, all cells, cells below their label,
    queueing, losslessness, failures."""
    summary, low = t.summary, t.low
    _table(
        pd.DataFrame(provenance(summary, environment, view, simulated), columns=["item", "value"]),
        data,
        "provenance.csv",
        ["item", "value"],
    )
    workloads = (
        summary.groupby("workload", sort=False)
        .agg(family=("family", "first"), sessions=("sessions", "max"), content_mix=("content_mix", "first"))
        .reset_index()
    )
    _table(workloads, data, "workloads.csv", ["workload", "family", "content_mix"])
    spec = low[low["algorithm"] != algorithms.BASELINE][
        [
            "tp",
            "method",
            "workload",
            "acceptance_length",
            "acceptance_length_server",
            "tokens_per_chunk",
            "acceptance_length_sglang",
        ]
    ]
    has_spec = _table(spec, data, "acceptance.csv", ["method", "workload"])
    _cells_table(summary, data)
    return {"has_spec": has_spec, **_check_tables(summary, view, data)}


def _check_tables(summary: pd.DataFrame, view: dict, data: dict[str, str]) -> dict:
    """The appendix's checks, each a table of the cells it concerns and whether it has any: cells below their
    concurrency label, cells whose requests queued for a slot (open-loop load), losslessness against AR, failures."""
    below = summary[summary["concurrency_steady_mean"].isna() | (summary["concurrency_peak"] < summary["concurrency"])][
        ["tp", "method", "workload", "concurrency", "concurrency_mean", "concurrency_peak"]
    ]
    has_below = _table(below, data, "below_label.csv", ["method", "workload"])
    # waiting for a slot is open-loop load's: under closed loop a late client (host jitter) is no wait
    open_loop = view["load_model"] != "closed"
    queued = summary[open_loop & (summary["queue_delay_p99"].fillna(0) > 0.001)][
        ["tp", "method", "workload", "concurrency", "ttft_p50", "queue_delay_p50", "user_ttft_p50", "user_ttft_p99"]
    ]
    queued = queued.assign(
        **{c: queued[c] * 1000 for c in ("ttft_p50", "queue_delay_p50", "user_ttft_p50", "user_ttft_p99")}
    )
    has_queue = _table(queued, data, "queue.csv", ["method", "workload"])
    lossless = summary.dropna(subset=["lossless_compared"])[
        [
            "tp",
            "method",
            "workload",
            "concurrency",
            "lossless_compared",
            "lossless_exact_rate",
            "lossless_first_divergence_min",
        ]
    ]
    has_lossless = _table(lossless, data, "lossless.csv", ["method", "workload"])
    failed = summary[summary["requests_failed"] > 0][
        ["tp", "method", "workload", "concurrency", "requests_sent", "requests_failed", "failures"]
    ]
    has_failures = _table(failed, data, "failures.csv", ["method", "workload", "failures"])
    return {
        "has_below": has_below,
        "has_queue": has_queue,
        "has_lossless": has_lossless,
        "has_failures": has_failures,
    }


def provenance(summary: pd.DataFrame, environment: dict, view: dict, simulated: bool) -> list[tuple[str, str]]:
    """The provenance table's rows (item, value): backend, server and build, software, GPUs, model, sampling, the
    cost model, the settings that differ per method (attention backend, weights, stream, min-free-slots delay: one
    value, or each method's), and the simulated profile."""
    prov = [
        ("Backend", environment["backend"] + (" (simulated)" if simulated else "")),
        ("Server", f"{environment['server']['name']} {environment['server'].get('version')}"),
        ("Server build", environment["server"].get("build") or "release"),
        ("Python", environment["software"]["python"]),
        ("specsweep", environment["software"]["specsweep"]),
        ("Snakemake", environment["software"].get("snakemake")),
        ("GPUs", ", ".join(g["name"] for g in environment["hardware"]["gpus"]) or "none"),
        ("Model", view["model"]),
        ("Sampling", view.get("sampling", "")),
    ]
    if view.get("cost_model"):  # cost_model.labels: what the simulated servers ran and the plan priced with
        prov.append(("Cost model" if simulated else "Plan's cost model", view["cost_model"]))
    for label, column in (
        ("Attention backend", "attention_backend"),
        ("Weights", "load_format"),
        ("Stream", "stream"),
        ("Min-free-slots delay", "min_free_slots_delay"),
    ):
        if column in summary and summary[column].notna().any():
            per_method = summary.dropna(subset=[column]).groupby("method", sort=False)[column].first()
            values = {str(v) for v in per_method}
            text = values.pop() if len(values) == 1 else "; ".join(f"{m}: {v}" for m, v in per_method.items())
            if column == "load_format" and "dummy" in set(per_method):
                text += " (random weights of the model's shape: acceptance about 1, speedups meaningless)"
            prov.append((label, text))
    if simulated:
        prov.append(("Simulated profile", view.get("sim_profile", "")))
    return prov


def _cells_table(summary: pd.DataFrame, data: dict[str, str]) -> None:
    """The appendix's table of every cell: its load (concurrency held and peak, launches), requests, throughput and
    its precision (half the 95% interval, % of the value), speedup and latencies in ms."""
    half = (summary["output_throughput_hi"] - summary["output_throughput_lo"]) / 2 / summary["output_throughput"]
    cells = summary.assign(
        ttft_p50_ms=summary["ttft_p50"] * 1000,
        tpot_p50_ms=summary["tpot_p50"] * 1000,
        itl_p99_ms=summary["itl_p99"] * 1000,
        precision_pct=half.map(lambda v: "--" if pd.isna(v) else f"{v * 100:.1f}"),
        held=summary["concurrency_steady_mean"].map(lambda v: "--" if pd.isna(v) else f"{v:.1f}"),
    )
    _table(
        cells[
            [
                "tp",
                "method",
                "workload",
                "concurrency",
                "held",
                "concurrency_peak",
                "launches",
                "requests_completed",
                "requests_failed",
                "output_throughput",
                "precision_pct",
                "speedup",
                "ttft_p50_ms",
                "tpot_p50_ms",
                "itl_p99_ms",
            ]
        ],
        data,
        "cells.csv",
        ["method", "workload"],
    )


def plan_against_runs(
    predictions: pd.DataFrame, runs: dict[str, tuple[float, list[str]]], data: dict[str, str]
) -> dict:
    """Appendix: each server's latest run (start to stop, from its run record) against the plan's start-up plus
    the cells that run measured (cells it found cached cost it nothing). Error = (predicted - measured) /
    measured. ``has_plan``: whether there are predictions at all (an archived record has none)."""
    predicted: dict[str, dict] = {}
    for r in predictions.to_dict("records"):
        plan = predicted.setdefault(r["server"], {"startup": 0.0, "cells": {}})
        plan["startup"] += r["startup_s"]
        plan["cells"][r["path"]] = r["warmup_s"] + r["measure_s"]
    rows = []
    for server, (seconds, cells) in runs.items():
        if server in predicted and all(c in predicted[server]["cells"] for c in cells):
            plan_s = predicted[server]["startup"] + sum(predicted[server]["cells"][c] for c in cells)
            rows.append(
                {
                    "server": server,
                    "cells": len(cells),
                    "predicted_s": plan_s,
                    "measured_s": seconds,
                    "error_pct": (plan_s - seconds) / seconds * 100,
                }
            )
    has_prediction = _table(
        pd.DataFrame(rows, columns=["server", "cells", "predicted_s", "measured_s", "error_pct"]),
        data,
        "prediction.csv",
        ["server"],
    )
    return {"has_prediction": has_prediction, "has_plan": not predictions.empty}


def prepare(
    tables_dir: str | Path,
    environment: dict,
    view: dict,
    predictions: pd.DataFrame | None = None,
    runs: dict | None = None,
) -> tuple[dict, dict[str, str]]:
    """(the template context, {file name: CSV text} of every chart and table)."""
    data: dict[str, str] = {}
    t = Tables.read(tables_dir)
    summary, tps, lowest = t.summary, t.tps, t.lowest
    methods = list(dict.fromkeys(view["methods"]))
    simulated = bool(summary["simulated"].any()) if len(summary) else bool(environment.get("simulated"))
    figs = Figures(data, methods)
    flags = {
        **single_stream(t, figs),
        **budget_sweep(t, figs, data),
        **tensor_parallelism(t, figs, data),
        **concurrency(t, figs, data),
        **agentic(t, figs, data),
        **engines_section(tables_dir, data),
        **setup_tables(t, environment, view, simulated, data),
        **plan_against_runs(
            predictions
            if predictions is not None
            else pd.DataFrame(columns=["server", "path", "startup_s", "warmup_s", "measure_s"]),
            runs or {},
            data,
        ),
    }
    by_section = {key: [s for s in figs.specs if s["section"] == key] for key in SECTIONS}
    context = {
        **flags,
        "simulated": simulated,
        "methods": methods,
        "sections": SECTIONS,
        "figures": by_section,
        "title": tex_escape(view["title"]),
        "author": tex_escape(view["author"]),
        "date": tex_escape(view.get("date") or date.today().isoformat()),
        "model": tex_name(view["model"]),
        "backend": tex_escape(environment["backend"]),
        "sim_profile": tex_escape(view.get("sim_profile", "")),
        "sim_runtime": tex_escape(view.get("plan_profile", "")),
        **_run_context(summary, methods, tps, lowest),
        "warmup": view["warmup"],
        "resamples": BOOTSTRAP_RESAMPLES,
        "definitions": [(tex_escape(n), tex_escape(d)) for n, d in definitions()],
        "statistics": [(tex_escape(n), tex_escape(d)) for n, d in statistics()],
        "min_sessions": MIN_SESSIONS,
    }
    return context, dict(sorted(data.items()))


def _run_context(summary: pd.DataFrame, methods: list[str], tps: list, lowest) -> dict:
    """What the report's text says of the run, from the summary: its servers and cells, TP sizes, methods,
    workloads and concurrency levels, launches per cell, whether weights were random and an AR method measured."""
    return {
        "n_servers": summary[["tp", "method"]].drop_duplicates().shape[0],
        "n_cells": len(summary),
        "tps": ", ".join(str(tp) for tp in tps),
        "method_list": ", ".join(tex_name(m) for m in methods),
        "workload_list": ", ".join(tex_name(w) for w in summary["workload"].unique()),
        "concurrency_list": ", ".join(str(c) for c in sorted(summary["concurrency"].unique())),
        "lowest_concurrency": lowest,
        "n_concurrency": int(summary["concurrency"].nunique()),
        "launches": int(summary["launches"].max()) if len(summary) else 1,
        "dummy_weights": bool(len(summary)) and bool((summary["load_format"] == "dummy").any()),
        "has_ar": bool(summary["speedup"].notna().any()),
    }


def write_report_data(
    tables_dir: str | Path,
    environment_json: str | Path,
    view: dict,
    predictions_csv: str | Path,
    run_records: list[str],
    out_json: str | Path,
) -> None:
    """The report's data, the one file both report rules read: {"context": the template's context, "csv": {file
    name: text} for every chart and table}. Written atomically."""
    environment = json.loads(Path(environment_json).read_text())
    ctx, csv = prepare(tables_dir, environment, view, pd.read_csv(predictions_csv), read_run_records(run_records))
    write_data(ctx, csv, out_json)


def write_data(ctx: dict, csv: dict[str, str], out_json: str | Path) -> None:
    """The report's data file: {"context": the template's context, "csv": {file name: text}}, written atomically."""
    atomic_write_text(out_json, json.dumps({"context": ctx, "csv": csv}))


def read_report_data(data_json: str | Path) -> tuple[dict, dict[str, str]]:
    """(the template's context, {CSV file name: text})."""
    data = json.loads(Path(data_json).read_text())
    return data["context"], data["csv"]


def render_tex(ctx: dict) -> str:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("specsweep", "templates"),
        block_start_string=r"\BLOCK{",
        block_end_string="}",
        variable_start_string=r"\VAR{",
        variable_end_string="}",
        comment_start_string=r"\#{",
        comment_end_string="}",
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("report.tex.j2").render(**ctx)


def compile_pdf(tex_path: Path, log_path: Path | None = None) -> Path:
    """Compile with latexmk (pdflatex); raise ReportError with the log's tail on failure."""
    if not shutil.which("latexmk") or not shutil.which("pdflatex"):
        raise ReportError(TEX_MISSING)
    proc = subprocess.run(
        ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error", tex_path.name],
        cwd=tex_path.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if log_path:
        log_path.write_text(proc.stdout + proc.stderr)
    pdf = tex_path.with_suffix(".pdf")
    if proc.returncode != 0 or not pdf.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise ReportError(f"latexmk failed on {tex_path}:\n{tail}")
    return pdf


def build_report(data_json: str, out_pdf: str, log_path: str | None = None) -> None:
    """The report's data -> report.tex, the CSVs it reads (data/ beside it) and report.pdf, in out_pdf's folder."""
    out = Path(out_pdf)
    ctx, csv = read_report_data(data_json)
    folder = out.parent / "data"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, text in csv.items():
        (folder / name).write_text(text)
    tex = out.with_suffix(".tex")
    tex.write_text(render_tex({**ctx, "renderer": tex_escape(renderer_stamp())}))  # the code rendering it now
    pdf = compile_pdf(tex, Path(log_path) if log_path else None)
    if pdf != out:
        shutil.move(pdf, out)


def plot_figures(data_json: str, out_dirs: dict[str, str]) -> None:
    """Every chart of the PDF as a matplotlib PNG, one folder per report section (for Snakemake's report). Imported
    here: matplotlib (heavy, needed by this job alone, and its backend must be chosen before pyplot is imported)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx, csv = read_report_data(data_json)
    for section, folder in out_dirs.items():
        Path(folder).mkdir(parents=True, exist_ok=True)
        for spec in ctx["figures"][section]:
            data = pd.read_csv(io.StringIO(csv[Path(spec["csv"]).name]))
            fig, ax = plt.subplots(figsize=(7, 4.2))
            _draw(ax, spec, data)
            ax.set_xlabel(spec["xlabel"].replace("\\%", "%"))
            ax.set_ylabel(spec["ylabel"].replace("\\%", "%"))
            ax.grid(alpha=0.3)
            entries = len(spec["labels"]) + len(spec.get("reference") or [])
            ax.legend(
                fontsize=8,
                ncol=min(spec["legend_columns"], entries),
                loc="upper center",
                bbox_to_anchor=(0.5, -0.16),
                frameon=False,
            )
            if ctx["simulated"]:
                fig.suptitle("SIMULATED BACKEND: not measured on GPUs", color="darkred", fontsize=10)
            fig.tight_layout()
            fig.savefig(Path(folder) / f"{spec['id']}.png", dpi=100)
            plt.close(fig)


def _draw(ax, spec: dict, data: pd.DataFrame) -> None:
    labels = spec["labels"]
    if spec["kind"] == "line":
        for i, label in enumerate(labels):
            err = [data[f"s{i}_minus"], data[f"s{i}_plus"]]
            ax.errorbar(
                data[spec["x"]],
                data[f"s{i}"],
                yerr=err,
                marker="o",
                capsize=3,
                label=label,
                color=MPL_COLORS[i % len(MPL_COLORS)],
            )
        for j, ref in enumerate(spec.get("reference") or []):
            ax.axhline(ref["value"], linestyle="--", color="black", alpha=0.6 - 0.15 * j, label=ref["text"])
        if spec.get("logx"):
            ax.set_xscale("log", base=2)
    elif spec["kind"] == "bar":
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            err = [data[f"s{i}_minus"], data[f"s{i}_plus"]]
            ax.bar(
                data["x"] + (i - (len(labels) - 1) / 2) * width,
                data[f"s{i}"],
                width,
                yerr=err,
                capsize=3,
                label=label,
                color=MPL_COLORS[i % len(MPL_COLORS)],
            )
        ax.set_xticks(range(len(spec["xlabels"])), spec["xlabels"])
        if spec.get("baseline") is not None:
            ax.axhline(spec["baseline"], linestyle="--", color="black")
    else:
        for i, label in enumerate(labels):
            ax.scatter(data[f"x{i}"], data[f"y{i}"], s=24, label=label, color=MPL_COLORS[i % len(MPL_COLORS)])
        ax.plot(
            data["fx"],
            data["fy"],
            color="black",
            linestyle=":",
            marker="o",
            fillstyle="none",
            markersize=9,
            label="Pareto frontier",
        )
