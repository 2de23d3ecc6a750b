"""The report: one CSV per chart and table, the LaTeX document (pgfplots), its PDF, and matplotlib figures.

Every number shown comes from the aggregated tables (results/*.csv) through
the CSV files written here; the .tex only names columns. The same figure
specifications drive the pgfplots charts of the PDF and the matplotlib
figures of Snakemake's HTML report.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from datetime import date
from html import escape
from pathlib import Path

import jinja2
import pandas as pd

from . import __version__, algorithms, verdict
from .cache import read_run_records
from .canon import atomic_write_text
from .aggregate import ALL_KINDS, NOT_RECORDED, NOT_REPORTED
from .layout import REPORT_SECTIONS as SECTIONS
from .layout import REPORT_SUBSECTIONS as SUBSECTIONS
from .metrics import BOOTSTRAP_RESAMPLES, MIN_SESSIONS, Z_975, definitions, statistics
from .slo import STATES

TEX_MISSING = (
    "latexmk or pdflatex was not found. Install TeX Live: "
    "sudo apt-get install texlive-latex-base texlive-latex-recommended texlive-pictures "
    "texlive-science lmodern latexmk (or run the README's set-up command tools/setup.sh)."
)
LEGEND_CHARACTERS = 90  # characters of legend entries (with their marks) that fit across a chart
CHART_WIDTH_CM = 14  # a chart's axis, where its tick labels go (0.9 of the text block)
# Okabe and Ito's colour-blind-safe palette (its yellow left out: too pale on white), ordered so that neighbours in a
# method list differ most; the template defines each as a named colour (render_tex)
PALETTE = (
    ("ssblack", "000000"),
    ("ssorange", "E69F00"),
    ("ssblue", "0072B2"),
    ("ssgreen", "009E73"),
    ("ssvermillion", "D55E00"),
    ("ssskyblue", "56B4E9"),
    ("sspurple", "CC79A7"),
)
# marks, each as (matplotlib marker, filled, pgfplots mark): filled shapes first, then the same shapes open
MARKS = (
    ("o", True, "*"),
    ("s", True, "square*"),
    ("^", True, "triangle*"),
    ("d", True, "diamond*"),
    ("p", True, "pentagon*"),
    ("o", False, "o"),
    ("s", False, "square"),
    ("^", False, "triangle"),
    ("d", False, "diamond"),
)
DASHES = (("-", "solid"), ("--", "dashed"), (":", "densely dotted"), ("-.", "dashdotted"))  # (matplotlib, pgfplots)
GRID_ROWS = 4  # rows of panels in one figure of small multiples (a page holds four with their legend and caption)
LOG_SPAN = 10  # an axis whose values span more than this factor (all of them positive) is drawn on a log scale


def series_style(index: int) -> dict:
    """The style of the index-th series: colour index mod 7 of PALETTE, mark index mod 9 of MARKS (7 and 9 have no
    common factor: 63 series before a colour and a mark repeat together), and from the eighth on a line style of
    DASHES as well. Both renderers read it: color (pgfplots colour name), rgb (#RRGGBB), mark (pgfplots), marker and
    filled (matplotlib), dash (pgfplots) and linestyle (matplotlib)."""
    color, rgb = PALETTE[index % len(PALETTE)]
    marker, filled, mark = MARKS[index % len(MARKS)]
    linestyle, dash = DASHES[index // len(PALETTE) % len(DASHES)]
    return {
        "index": index,
        "color": color,
        "rgb": f"#{rgb}",
        "mark": mark,
        "marker": marker,
        "filled": filled,
        "dash": dash,
        "linestyle": linestyle,
    }


# a horizontal reference line's style where it is no method's
REFERENCE_STYLE = {
    "color": "black",
    "rgb": "#000000",
    "mark": "none",
    "marker": "",
    "filled": False,
    "dash": "dashed",
    "linestyle": "--",
}


def method_style(name: str, methods: list[str]) -> dict:
    """A method's one style in every chart of a report (series_style): from its position in the configuration's
    method list (the report view's ``methods``, sweeps expanded), so that a method keeps its colour and mark whichever
    others a chart leaves out."""
    if name not in methods:
        raise ReportError(f"chart series {name!r} is not one of the configured methods ({', '.join(methods)})")
    return series_style(methods.index(name))


def _drawn(values) -> pd.Series:
    """The values a chart draws: numbers, neither missing nor infinite (a chart leaves a gap there)."""
    numbers = pd.to_numeric(pd.Series(list(values), dtype=float), errors="coerce")
    return numbers[numbers.abs() < math.inf]


def log_scale(values, lows=()) -> bool:
    """Whether an axis showing these values is drawn on a log scale: the largest is more than LOG_SPAN times the
    smallest, and every value and every error bar's lower end (``lows``) is positive (missing and infinite ones,
    which a chart leaves out, aside)."""
    numbers, ends = _drawn(values), _drawn(lows)
    if numbers.empty or (numbers <= 0).any() or (ends <= 0).any():
        return False
    return bool(numbers.max() > LOG_SPAN * numbers.min())


def log_ticks(values) -> list[float]:
    """Ticks of a log axis over these values: 1, 2 and 5 times the powers of ten from the last at or below the
    smallest value (where the axis starts) to the largest, or where that makes more than 8, 1 and 3 times them, or
    the powers alone."""
    numbers = _drawn(values)
    low, high = numbers.min(), numbers.max()
    decades = range(math.floor(math.log10(low)), math.floor(math.log10(high)) + 1)
    for steps in ((1, 2, 5), (1, 3), (1,)):
        grid = [m * 10.0**d for d in decades for m in steps]
        start = max(v for v in grid if v <= low)
        ticks = [v for v in grid if start <= v <= high]
        if len(ticks) <= 8:
            break
    return ticks


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
# a name may break after each of these (a method on an engine: method@engine), after an underscore (tex_escape) and
# a hyphen (TeX)
NAME_BREAKS = "./:@"
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
    """One row per x; per series i: s<i>, s<i>_plus, s<i>_minus (error bar lengths; NaN where a point has no CI, so
    that neither renderer draws a bar of no length there, which would read as an interval)."""
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
        out[f"s{i}_plus"] = out[x].map(sub[hi].mean() - mean).clip(lower=0) if hi else float("nan")
        out[f"s{i}_minus"] = out[x].map(mean - sub[lo].mean()).clip(lower=0) if lo else float("nan")
    return out


class Figures:
    """Collects figure specifications and the CSV text each one draws (in ``data``, by file name). A chart whose
    series are methods draws each in its method's style (method_style: one colour and mark per method in every
    chart); other series take series_style by their place in the chart. Values that span more than LOG_SPAN are
    drawn on a log axis (log_scale), a linear axis of these non-negative quantities starts at 0, and a caption's
    error-bar clause (``errors``) is written from what the chart draws (_error_clause)."""

    def __init__(self, data: dict[str, str], methods: list[str]):
        self.data, self.methods = data, methods
        self.specs: list[dict] = []

    def _series(self, frame, col):
        present = set(frame[col])
        order = [m for m in self.methods if m in present] if col == "method" else sorted(present, key=str)
        return order

    def style(self, name, series: list, series_col: str = "method") -> dict:
        """The style of series ``name`` of a chart whose series are ``series``."""
        return method_style(name, self.methods) if series_col == "method" else series_style(series.index(name))

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
        errors=None,
    ):
        """A line chart of y against x, one line per series, error bars from the lo and hi columns (``errors``: what
        they are, for the caption); horizontal ``reference`` lines ({label, text, value, and a style})."""
        spec = self.panel(
            fid, frame, x, y, lo, hi, xlabel, ylabel, series_col=series_col, logx=logx, reference=reference
        )
        if spec:
            self.specs.append({**spec, "section": section, "caption": _error_clause(caption, errors, [spec])})

    def panel(
        self,
        fid,
        frame,
        x,
        y,
        lo,
        hi,
        xlabel,
        ylabel,
        title="",
        series_col="method",
        logx=False,
        reference=None,
        joins=None,
        labels=None,
    ) -> dict | None:
        """A line chart's spec without its place in the report (line() places one, grid() several); None where there
        is nothing to draw (no value, or one x). ``joins``: a column naming groups whose points a thin grey line
        joins (in order of x, over the gaps of other series); ``labels``: legend text per series, else its name."""
        frame = frame.dropna(subset=[y])
        if frame.empty or frame[x].nunique() < 2:
            return None
        series = self._series(frame, series_col)
        wide = _wide(frame, series, series_col, x, y, lo, hi)
        groups = sorted(frame[joins].unique(), key=str) if joins else []
        if groups:
            lines = _wide(frame, groups, joins, x, y, None, None)
            wide = wide.assign(**{f"l{j}": lines[f"s{j}"] for j in range(len(groups))})
        spec = self._spec(
            fid, "line", wide, x, xlabel, ylabel, series, series_col, labels, logx=logx, reference=reference
        )
        return {**spec, "title": title, "joins": [f"l{j}" for j in range(len(groups))], "intervals": bool(lo or hi)}

    def grid(self, section, fid, panels: list[dict | None], caption, errors=None, columns=2):
        """One figure of small multiples: ``panels`` (panel() specs; None ones left out) ``columns`` to a row, one
        legend for all (every series and reference line of any panel, in the order of the configuration's methods);
        more than GRID_ROWS rows go on as further figures (id -2, -3, ...), each a page at most."""
        shown = [p for p in panels if p]
        per_figure = columns * GRID_ROWS
        parts = [shown[i : i + per_figure] for i in range(0, len(shown), per_figure)]
        for n, part in enumerate(parts, 1):
            series: dict[str, dict] = {}
            references: dict[str, dict] = {}
            for p in part:
                series.update({s["name"]: s for s in p["series"]})
                references.update({r["label"]: r for r in p.get("reference") or []})
            ordered = sorted(series.values(), key=lambda s: s["index"])
            entries = [s["text"] for s in ordered] + [r["text"] for r in references.values()]
            name = fid if n == 1 else f"{fid}-{n}"
            self.specs.append(
                {
                    "section": section,
                    "id": name,
                    "kind": "grid",
                    "panels": part,
                    "columns": columns,
                    "caption": _error_clause(
                        caption + (f" Part {n} of {len(parts)}." if len(parts) > 1 else ""), errors, part
                    ),
                    "series": ordered,
                    "labels": [s["text"] for s in ordered],
                    "reference": list(references.values()),
                    "legend_name": "legend-" + re.sub("[^A-Za-z0-9]", "", name),
                    "legend_columns": _legend_columns(entries),
                }
            )

    def bars(
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
        baseline=None,
        errors=None,
    ):
        """Grouped bars of y per x label (in order of appearance), one bar per series, error bars from lo and hi
        (``errors``: what they are); a dashed ``baseline``. Bars keep a linear axis from 0: a bar's length is its
        value."""
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
            series_col=series_col,
            errors=errors,
            intervals=bool(lo or hi),
            xlabels=[str(v) for v in labels],
            baseline=baseline,
        )

    def scatter(
        self, section, fid, frame, x, y, xlabel, ylabel, caption, series_col="method", path=None, point_label=None
    ):
        """Points per series (columns x<i>, y<i>), plus the Pareto-frontier points (fx, fy) where the frame has
        on_frontier. ``path``: columns in whose order a series' points are joined by its line (a line breaks where
        any but the last changes: one line per TP size, say, in order of concurrency); ``point_label``: a column
        written beside each point (t<i>)."""
        frame = frame.dropna(subset=[x, y])
        if frame.empty:
            return
        series = self._series(frame, series_col)
        columns: dict[str, pd.Series] = {}
        for i, name in enumerate(series):
            sub = _path(frame[frame[series_col] == name], path)
            columns[f"x{i}"], columns[f"y{i}"] = sub[x].astype(float), sub[y].astype(float)
            if point_label:
                columns[f"t{i}"] = sub[point_label]
        front = frame[frame["on_frontier"]].sort_values(x) if "on_frontier" in frame else frame.iloc[0:0]
        columns["fx"], columns["fy"] = front[x].astype(float), front[y].astype(float)
        wide = pd.DataFrame({k: pd.Series(list(v), dtype=object if k[0] == "t" else float) for k, v in columns.items()})
        logx, logy = log_scale(frame[x]), log_scale(frame[y])
        self._add(
            section,
            fid,
            "scatter",
            wide,
            "x0",
            xlabel,
            ylabel,
            caption,
            series,
            series_col=series_col,
            joined=bool(path),
            point_labels=bool(point_label),
            logx=logx,
            logy=logy,
            xticks=_ticks(frame[x]) if logx else "",
            yticks=_ticks(frame[y]) if logy else "",
        )

    def _add(self, section, fid, kind, wide, x, xlabel, ylabel, caption, series, **extra):
        """Write a chart's CSV and add its spec; ``series_col`` and ``errors`` (keywords) as line() takes them."""
        series_col, errors = extra.pop("series_col", "method"), extra.pop("errors", None)
        spec = self._spec(fid, kind, wide, x, xlabel, ylabel, series, series_col, None, **extra)
        self.specs.append({**spec, "section": section, "caption": _error_clause(caption, errors, [spec])})

    def _spec(self, fid, kind, wide, x, xlabel, ylabel, series, series_col, labels, **extra) -> dict:
        """A chart's spec (its CSV written to ``data``): its series, each with its style and legend text."""
        name = f"{fid}.csv"
        self.data[name] = wide.to_csv(index=False, na_rep="nan")
        texts = [str((labels or {}).get(s, s)) for s in series]
        if "reference" in extra:  # a line of no method's (a target, say) in black
            extra["reference"] = [{**REFERENCE_STYLE, **r} for r in extra["reference"] or []]
        spec = {
            "id": fid,
            "kind": kind,
            "csv": f"data/{name}",
            "x": x,
            "xlabel": xlabel,
            "ylabel": ylabel,
            "labels": texts,
            "series": [
                {
                    **self.style(s, series, series_col),
                    "col": f"s{i}",
                    "n": i,
                    "name": str(s),
                    "text": text,
                    "label": tex_escape(text),
                    **_error_bars(wide, f"s{i}"),
                }
                for i, (s, text) in enumerate(zip(series, texts))
            ],
            **extra,
        }
        if kind == "line":
            spec["xticks"] = ",".join(f"{v:g}" for v in wide[x])
            values = [wide[f"s{i}"] for i in range(len(series))] + [
                pd.Series([r["value"] for r in spec.get("reference") or []])
            ]
            lows = [wide[f"s{i}"] - wide[f"s{i}_minus"] for i in range(len(series))]
            highs = [wide[f"s{i}"] + wide[f"s{i}_plus"] for i in range(len(series))]
            spec["logy"] = log_scale(pd.concat(values), pd.concat(lows))
            spec["yticks"] = _ticks(pd.concat(values + lows + highs)) if spec["logy"] else ""
        if kind == "bar":
            spec["xticks"] = ",".join(str(i) for i in range(len(extra["xlabels"])))
            spec["xlabels_tex"] = ",".join(r"{\hspace{0pt}" + tex_name(v) + "}" for v in extra["xlabels"])  # may break
            spec["bar_width"] = max(3, min(14, int(260 / max(1, len(series) * len(extra["xlabels"])))))
            spec["xlabel_width_cm"] = round(0.8 * CHART_WIDTH_CM / len(extra["xlabels"]), 2)  # a long name wraps
        entries = texts + [r["text"] for r in extra.get("reference") or []]
        entries += ["Pareto frontier"] if kind == "scatter" else []
        spec["legend_columns"] = _legend_columns(entries)
        return spec


def _ticks(values) -> str:
    """A log axis's ticks (log_ticks) as the template writes them."""
    return ",".join(f"{v:g}" for v in log_ticks(values))


def _legend_columns(entries: list[str]) -> int:
    """Legend columns across a chart: as many of the longest entry (with its mark) as fit, 1 to 4, and no more than
    its rows need (five entries in rows of 3 and 2, not 4 and 1)."""
    fit = max(1, min(4, LEGEND_CHARACTERS // (max(map(len, entries), default=1) + 6)))
    rows = -(-max(1, len(entries)) // fit)
    return -(-max(1, len(entries)) // rows)


def _path(frame: pd.DataFrame, path: list[str] | None) -> pd.DataFrame:
    """A series' points in the order of the ``path`` columns, a row of NaN (a break in its line) where any but the
    last of them changes."""
    if not path:
        return frame
    frame = frame.sort_values(path)
    if len(path) < 2:
        return frame
    parts = [group for _, group in frame.groupby(path[:-1], sort=True)]
    gap = pd.DataFrame([{c: float("nan") for c in frame.columns}])
    return pd.concat([p for part in parts for p in (part, gap)][:-1], ignore_index=True)


def _error_bars(wide: pd.DataFrame, col: str) -> dict:
    """Whether a series draws an error bar at any of its points (error_bars), and at every point it draws
    (all_error_bars; a point without an interval has NaN lengths, _wide)."""
    if f"{col}_plus" not in wide:
        return {"error_bars": False, "all_error_bars": False}
    plus, minus, shown = wide[f"{col}_plus"], wide[f"{col}_minus"], wide[col].notna()
    return {
        "error_bars": bool((plus.gt(0) | minus.gt(0)).any()),
        "all_error_bars": bool((plus.notna() | minus.notna())[shown].all()),
    }


def _error_clause(caption: str, errors: str | None, specs: list[dict]) -> str:
    """A caption with what its error bars are (``errors``, e.g. "95\\% CI") where the chart draws any: "Error bars:
    <errors>." where every point has one, "... where an interval exists" where only some do, and where none does,
    that none is drawn and why: no cell had the sessions (or, for a percentile, the values beyond it) an interval
    needs."""
    if not errors:
        return caption
    series = [s for spec in specs if spec.get("intervals", True) for s in spec["series"]]  # charts with intervals
    drawn = [s["error_bars"] for s in series]
    if all(s["error_bars"] and s["all_error_bars"] for s in series):
        return f"{caption} Error bars: {errors}."
    if any(drawn):
        return f"{caption} Error bars: {errors}, where an interval exists."
    return f"{caption} No error bars: too few sessions (or values beyond a percentile) for a 95\\% interval."


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
        # copied once read: a wide table comes back in a block per column, and every column a section adds to a
        # block-per-column frame is slow (pandas warns that it is highly fragmented)
        return cls(
            *(
                pd.read_csv(tables_dir / f"{name}.csv").copy()
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
            f"(up to {n_req} measured requests per cell).",
            errors="95\\% bootstrap CI",
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
            "order; dashed line: no speedup).",
            baseline=1,
            errors="95\\% paired-bootstrap CI",
        )
    return {}


def _mixed(frame: pd.DataFrame) -> list:
    """The workloads whose cells mix two or more content kinds, in the table's order."""
    kinds = frame[frame["kind"] != ALL_KINDS].groupby("workload", sort=False)["kind"].nunique()
    return [w for w, n in kinds.items() if n > 1]


def _sessions_per_kind(rows: pd.DataFrame) -> str:
    """'chat 8, code 8, ...': the sessions of each content kind in these rows (the most any method's cell had)."""
    return ", ".join(f"{kind} {int(n)}" for kind, n in rows.groupby("kind")["sessions"].max().items())


def _in_method_order(frame: pd.DataFrame, methods: list[str], keys: list[str]) -> pd.DataFrame:
    """The rows sorted by ``keys``, then by method in the configuration's order (``methods``)."""
    rank = {m: i for i, m in enumerate(methods)}
    ordered = frame.assign(_rank=frame["method"].map(lambda m: rank.get(m, len(rank))))
    return ordered.sort_values([*keys, "_rank"], kind="stable").drop(columns="_rank")


def _interval_text(lo, hi) -> str:
    """'[lo; hi]' to two decimals, or -- where there is no interval."""
    return "--" if pd.isna(lo) or pd.isna(hi) else f"[{lo:.2f}; {hi:.2f}]"


KIND_TABLE = ["tp", "workload", "kind", "sessions", "method", "output_throughput", "speedup", "speedup_ci"]


def content_kinds(t: Tables, figs: Figures, data: dict[str, str], tables_dir: str | Path) -> dict:
    """Section 2's subsection by content kind (results/kinds.csv) at the lowest concurrency, for every workload
    whose sessions mix kinds: a chart of each speculative method's speedup over AR per kind (its paired interval
    where the kind has MIN_SESSIONS sessions) per workload and TP size, and a table of each kind's throughput,
    speedup with its interval and acceptance length, every method's."""
    kinds = _read_table(tables_dir, "kinds")
    if kinds.empty:
        return {"has_kinds": False}
    low = kinds[kinds["concurrency"] == t.lowest]
    mixed = _mixed(low)
    low = low[low["workload"].isin(mixed)]
    for tp in t.tps:
        for workload in mixed:
            _kinds_chart(figs, low[(low["tp"] == tp) & (low["workload"] == workload)], workload, tp, t.lowest)
    shown = _in_method_order(
        low.assign(speedup_ci=[_interval_text(lo, hi) for lo, hi in zip(low["speedup_lo"], low["speedup_hi"])]),
        figs.methods,
        ["tp", "workload", "kind"],
    )
    has_kinds = _table(
        shown[[*KIND_TABLE, "acceptance_length"]], data, "content_kinds.csv", ["workload", "kind", "method"]
    )
    one_kind = [w for w in kinds["workload"].unique() if w not in mixed]
    return {
        "has_kinds": has_kinds,
        "kinds_one": ", ".join(
            f"{tex_name(w)} ({', '.join(sorted(set(kinds.loc[kinds['workload'] == w, 'kind'])))})" for w in one_kind
        ),
    }


def _kinds_chart(figs: Figures, sub: pd.DataFrame, workload: str, tp, lowest) -> None:
    """One workload's and TP size's chart of speedup per content kind, its caption saying how many sessions each
    kind has and for which kinds there is no interval (fewer than MIN_SESSIONS sessions)."""
    spec = sub[sub["algorithm"] != algorithms.BASELINE]
    bare = sorted(set(spec.loc[spec["speedup"].notna() & spec["speedup_lo"].isna(), "kind"]))
    bars = (
        "error bars: 95\\% paired-bootstrap CI over the kind's sessions"
        + (f", none for {', '.join(bare)} (fewer than {MIN_SESSIONS} sessions)" if bare else "")
        if spec["speedup_lo"].notna().any()
        else f"no error bars: every kind has fewer than {MIN_SESSIONS} sessions, too few for an interval"
    )
    figs.bars(
        "kinds",
        f"kinds-speedup-{workload}-tp{tp}",
        spec,
        "kind",
        "speedup",
        "speedup_lo",
        "speedup_hi",
        "Content kind",
        "Speedup over AR",
        f"Speedup over AR per content kind, workload {tex_name(workload)}, TP {tp}, concurrency {lowest}: each "
        "kind's output tokens over the engine time charged to its sessions, against AR's on the same sessions. "
        f"Sessions per kind: {_sessions_per_kind(sub)}; {bars}; dashed line: no speedup.",
        baseline=1,
    )


DEPTH_COLUMNS_SHOWN = 8  # the per-kind table's depths (the rest are in results/acceptance_depth.csv)


def acceptance_per_depth(t: Tables, figs: Figures, data: dict[str, str], tables_dir: str | Path) -> dict:
    """Section 3's subsection on acceptance per draft depth (results/acceptance_depth.csv) at the lowest
    concurrency: a chart per workload and TP size of the acceptance rate against depth over all sessions, one line
    per speculative method whose build reported its rounds, and a table of the rates per content kind (the first
    DEPTH_COLUMNS_SHOWN depths) for the workloads that mix kinds; the methods whose build reported no rounds are
    named."""
    depth = _read_table(tables_dir, "acceptance_depth")
    if depth.empty:
        return {"has_depth": False}
    low = depth[depth["concurrency"] == t.lowest]
    silent = low[~low["reported"].astype(bool)]
    unreported = {
        note: ", ".join(tex_name(m) for m in sorted(set(silent.loc[silent["note"] == note, "method"])))
        for note in (NOT_REPORTED, NOT_RECORDED)
    }
    reported = low[low["reported"].astype(bool)]
    whole = reported[reported["kind"] == ALL_KINDS]
    for tp in t.tps:
        for workload in whole["workload"].unique():
            sub = whole[(whole["tp"] == tp) & (whole["workload"] == workload)]
            depths = _in_method_order(sub, figs.methods, []).groupby("method", sort=False)["draft_depth"].first()
            deepest = ", ".join(f"{tex_name(m)} {int(d)}" for m, d in depths.items())
            figs.line(
                "depth",
                f"depth-acceptance-{workload}-tp{tp}",
                sub,
                "depth",
                "acceptance",
                None,
                None,
                "Draft depth $d$",
                "Acceptance rate at depth $d$",
                f"Acceptance rate at each draft depth $d$, workload {tex_name(workload)}, TP {tp}, concurrency "
                f"{t.lowest}, all sessions: the share of verify rounds that accepted at least $d$ drafts (the "
                "server's rounds by drafts accepted, pooled over the cell's requests), to each method's deepest "
                f"draft ({deepest}); the rates sum to the acceptance length less one.",
            )
    kinds = _in_method_order(
        reported[reported["workload"].isin(_mixed(reported)) & (reported["depth"] <= DEPTH_COLUMNS_SHOWN)],
        figs.methods,
        ["tp", "workload"],
    )
    wide = kinds.pivot_table(
        index=["tp", "workload", "method", "kind"], columns="depth", values="acceptance", sort=False
    ).reset_index()
    # a depth read as a float (a table whose unreported rows have none) is named as the integer it is
    wide.columns = [f"d{int(c)}" if isinstance(c, (int, float)) else c for c in wide.columns]
    has_depth_kinds = _table(wide, data, "depth_kinds.csv", ["workload", "method", "kind"])
    return {
        "has_depth": not reported.empty or not silent.empty,
        "has_depth_kinds": has_depth_kinds,
        "depth_columns": [c for c in wide.columns if str(c).startswith("d") and str(c)[1:].isdigit()],
        "depth_cut": bool((reported["depth"] > DEPTH_COLUMNS_SHOWN).any()),
        "depth_shown": DEPTH_COLUMNS_SHOWN,
        "depth_unreported": unreported[NOT_REPORTED],
        "depth_unrecorded": unreported[NOT_RECORDED],
    }


def ddtree_stages(tables_dir: str | Path, data: dict[str, str]) -> dict:
    """Section 3's subsection on where a DDTree verify round's time goes (results/ddtree_stages.csv, a build's stage
    profiler per cell): per cell, milliseconds a round by part as its records say (measured; on the simulated backend
    the cost model's records) beside the simulator's split of the same round, and the stages kept as other by name."""
    table = _read_table(tables_dir, "ddtree_stages")
    if table.empty:
        return {"has_stages": False}
    shown = table.assign(
        engine=table["engine"].fillna(""),
        unknown=table["unknown"].fillna("").map(lambda v: v.replace(";", " ") or "--"),
    )
    _table(shown, data, "ddtree_stages.csv", ["method", "workload", "unknown"])
    return {
        "has_stages": True,
        "stages_simulated": bool(table["simulated"].astype(bool).all()),
        "stages_modelled": bool(table["modelled_ms_round"].notna().any()),
        "stages_unknown": ", ".join(
            tex_name(n) for n in sorted({n for v in table["unknown"].dropna() for n in str(v).split(";") if n})
        ),
    }


def width_cliff(tables_dir: str | Path, data: dict[str, str]) -> dict:
    """Section 3's subsection on DDTree's width cliff (results/width_cliff.csv, aggregate.width_cliff): each budget
    against its configuration's budget of the chain's width, per workload and concurrency, ratios with their paired
    intervals; and a sentence per wider budget: the range of its throughput ratios and the cells where it is
    slower (throughput) or dearer a round (TPOT p50) beyond its interval."""
    frame = _read_table(tables_dir, "width_cliff")
    if frame.empty:
        return {"has_width_cliff": False}
    shown = pd.DataFrame(
        {
            "tp": frame["tp"],
            "workload": frame["workload"],
            "concurrency": frame["concurrency"],
            "method": frame["method"],
            "reference": frame["reference"],
            **_paired_ratio_cells(frame),
            "cuda_graph": [
                _graph_shares(*v) for v in zip(frame["cuda_graph_share"], frame["reference_cuda_graph_share"])
            ],
        }
    )
    _table(shown, data, "width_cliff.csv", ["workload", "method", "reference"])
    return {"has_width_cliff": True, "width_cliff_words": "; ".join(_cliff_words(g) for _, g in _cliff_groups(frame))}


def _graph_shares(wider, chain) -> str:
    """The width cliff's CUDA graph column: the wider budget's and the chain-width budget's share of profiled rounds
    run as a captured CUDA graph ("1.00 / 1.00"), -- for a side without a stage profiler."""
    return " / ".join("--" if pd.isna(v) else f"{float(v):.2f}" for v in (wider, chain))


def _cliff_groups(frame: pd.DataFrame):
    """width_cliff's rows by configuration, TP size and budget against its reference."""
    return frame.groupby(["family", "tp", "method", "reference"], sort=False)


def _cliff_words(rows: pd.DataFrame) -> str:
    """One wider budget against its reference, in words: its verify width against the chain's, the range of its
    throughput ratios, and the cells (workload/concurrency) where its throughput is lower, or its TPOT p50 higher,
    than the reference's beyond the 95% interval."""
    first = rows.iloc[0]
    throughput = rows["output_throughput_ratio"].dropna()
    span = f"{throughput.min():.2f}-{throughput.max():.2f}x" if len(throughput) else "no ratio"
    where = [f"{w}/{c}" for w, c in zip(rows["workload"], rows["concurrency"])]
    # a cell once, whatever its repetitions
    slower = list(
        dict.fromkeys(x for x, hi in zip(where, rows["output_throughput_ratio_hi"]) if pd.notna(hi) and hi < 1)
    )
    dearer = list(dict.fromkeys(x for x, lo in zip(where, rows["tpot_p50_ratio_lo"]) if pd.notna(lo) and lo > 1))
    tp = f" at TP {int(first['tp'])}" if int(first["tp"]) != 1 else ""
    return (
        f"{tex_name(first['method'])} (a verify of {int(first['verify_width'])} tokens) against "
        f"{tex_name(first['reference'])} ({int(first['reference_verify_width'])}){tp}: throughput {span} of it, "
        f"lower beyond its interval at {_cells_words(slower)}, a round (TPOT p50) dearer beyond it at "
        f"{_cells_words(dearer)}"
    )


def _cells_words(cells: list[str]) -> str:
    """Cells as workload/concurrency, comma-separated (LaTeX-escaped); "none" where there are none."""
    return ", ".join(tex_name(c) for c in cells) if cells else "none"


def budget_sweep(t: Tables, figs: Figures, data: dict[str, str]) -> dict:
    """Section 3: for every speculative algorithm measured at two or more settings of its size (the registry's
    ``size``: DDTree's budget, NGRAM's and draft models' num_draft_tokens, DFlash's block), one figure of small
    multiples, a row per workload and TP size: acceptance and throughput against that size, each point one method in
    its style, its legend entry naming the shape it verifies (a chain, or a tree), a grey line joining the sizes of
    one configuration, DFlash as the reference line of the others; and the table of what every speculative method
    verifies."""
    low = t.low
    spec = low[low["algorithm"] != algorithms.BASELINE].dropna(subset=["sweep_size"])
    spec = spec.assign(join=_sweep_lines(spec))
    has_modes = _modes_table(spec, data)
    chain = low[low["algorithm"].isin([a.name for a in algorithms.REGISTRY.values() if a.reference])]
    place = {m: i for i, m in enumerate(figs.methods)}  # algorithms in the order of their first configured method
    first = spec["method"].map(lambda m: place.get(m, len(place))).groupby(spec["algorithm"]).min()
    for name in first.sort_values(kind="stable").index:
        _sweep_figure(t, figs, algorithms.get(name), spec[spec["algorithm"] == name], chain)
    return {"has_modes": has_modes}


FORCED_BREAK_EVEN_TABLE = ["tp", "workload", "concurrency", "family", "forced_lengths", "break_even"]


def forced_break_even(t: Tables, tables_dir: str | Path, data: dict[str, str]) -> dict:
    """Section 3's subsection on break-even acceptance (results/break_even_acceptance.csv, or computed from
    combined.csv where the results have no such table: verdict.acceptance_break_even): per TP, workload,
    concurrency and family of methods whose acceptance was forced, the forced lengths and the acceptance at which
    the family breaks even with AR; shown only where forced cells exist. ``forced_how``: how the acceptance was
    forced (SGLANG_SIMULATE_ACC_LEN on a real server, the simulator's forced drafter on the simulated backend, or
    both), ``forced_simulated`` and ``forced_measured`` whether any of its cells is simulated, or measured."""
    table = _read_table(tables_dir, "break_even_acceptance")
    if table.empty:
        table = verdict.acceptance_break_even(t.summary)
    if table.empty:
        return {"has_forced_break_even": False}
    shown = table[FORCED_BREAK_EVEN_TABLE].sort_values(["tp", "workload", "family", "concurrency"], kind="stable")
    # the interval in brackets without its words (the caption says what it is): no % for pgfplotstable to read
    shown = shown.assign(break_even=shown["break_even"].str.replace(verdict.INTERVAL_WORDS, "", regex=False))
    simulated = table["simulated"].astype(bool)
    how = [r"by SGLang's \texttt{SGLANG\_SIMULATE\_ACC\_LEN} on a real server"] if not simulated.all() else []
    how += ["by the simulator's forced drafter on the simulated backend"] if simulated.any() else []
    return {
        "has_forced_break_even": _table(shown, data, "break_even_acceptance.csv", ["workload", "family"]),
        "forced_simulated": bool(simulated.any()),
        "forced_measured": not bool(simulated.all()),
        "forced_how": " and ".join(how),
    }


def _sweep_figure(t: Tables, figs: Figures, algorithm, mine: pd.DataFrame, chain: pd.DataFrame) -> None:
    """One algorithm's sweep figure (budget_sweep): two panels per workload and TP size where it was measured at two
    or more sizes, acceptance length and throughput, against its size."""
    axis = SIZE_LABELS.get(algorithm.size or "", algorithm.size or "")  # one with sweep sizes has a size
    shapes = {m: _with_shape(m, mode) for m, mode in zip(mine["method"], mine["tree_mode"])}
    panels = []
    for tp in t.tps:
        for workload in t.summary["workload"].unique():
            sub = mine[(mine["tp"] == tp) & (mine["workload"] == workload)]
            if sub["sweep_size"].nunique() < 2:
                continue
            c = chain[(chain["tp"] == tp) & (chain["workload"] == workload)] if not algorithm.reference else chain[0:0]
            where = dict(title=f"{tex_name(workload)}, TP {tp}", joins="join", labels=shapes, logx=True)
            for metric, column, lo, hi, ylabel in (
                ("acceptance", "acceptance_length", None, None, "Acceptance length"),
                ("throughput", "output_throughput", "output_throughput_lo", "output_throughput_hi", "Tokens/s"),
            ):
                fid = f"sweep-{algorithm.name}-{metric}-{workload}-tp{tp}"
                references = _references(c, column, figs)
                panels.append(
                    figs.panel(fid, sub, "sweep_size", column, lo, hi, axis, ylabel, reference=references, **where)
                )
    dflash = any(p and p["reference"] for p in panels)
    figs.grid(
        "budget",
        f"sweep-{algorithm.name}",
        panels,
        f"{algorithm.title}: acceptance length (tokens per round, left) and output throughput (tokens/s, right) "
        f"against the {axis.lower()}, at concurrency {t.lowest}, a row per workload and TP size. Each point is one "
        "method, in its colour and mark; the legend gives the shape it verifies (chain or tree, widths in the "
        "table of modes); a grey line joins the sizes of one configuration"
        + ("; dashed: DFlash (a linear chain)." if dflash else "."),
        errors="95\\% CI (throughput)",
    )


def _modes_table(spec: pd.DataFrame, data: dict[str, str]) -> bool:
    """The table of what every speculative method verifies (its build, size, width cap, mode, width, tokens a
    round); whether it has any row."""
    modes = spec.drop_duplicates("method")[
        ["method", "algorithm", "tree_build", "sweep_size", "topk", "tree_mode", "tree_width", "verify_width"]
    ].sort_values(["algorithm", "sweep_size"])
    modes = modes.assign(
        tree_build=modes["tree_build"].astype(object).fillna("--"),
        **{c: modes[c].astype("Int64") for c in ("sweep_size", "topk", "tree_width", "verify_width")},
    )
    return _table(modes, data, "modes.csv", ["method", "algorithm", "tree_build", "tree_mode"])


def _references(chain: pd.DataFrame, column: str, figs: Figures) -> list[dict]:
    """A sweep chart's horizontal lines: each DFlash method's value of ``column`` in these rows, in its method's
    style, named once (legend_name)."""
    return [
        {
            **figs.style(m, []),
            "label": tex_escape(legend_name(m, algorithms.get(a).title)),
            "text": legend_name(m, algorithms.get(a).title),
            "value": float(v),
        }
        for m, a, v in zip(chain["method"], chain["algorithm"], chain[column])
        if pd.notna(v)
    ]


def legend_name(method: str, title: str) -> str:
    """A method's name beside its algorithm's title, each word once: the title alone where the method is named by it
    ("DFlash" for dflash), the method's name alone where it starts with it (dflash-b16), else both ("DFlash fast")."""
    plain = re.sub("[^a-z0-9]", "", method.lower())
    word = re.sub("[^a-z0-9]", "", title.lower())
    if plain == word:
        return title
    return method if plain.startswith(word) else f"{title} {method}"


def _with_shape(method: str, mode) -> str:
    """A method's legend entry in a sweep: its name and the shape it verifies ("ngram-d8 (tree)"), the name alone
    where it says the shape already (eagle3-chain)."""
    return method if str(mode).lower() in re.split("[^a-z0-9]+", method.lower()) else f"{method} ({mode})"


def _sweep_lines(spec: pd.DataFrame) -> list[str]:
    """Each speculative row's line in the sweep charts (the configuration whose sizes it joins): its algorithm, plus
    every other parameter (and the drafter) that differs between that algorithm's methods, and the method's name
    where two methods would still meet at one point: a point is one method's. The shape a setting verifies (chain or
    tree) is no parameter: DDTree's changes with its budget along one line."""
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
            labels.at[i] = algorithm.title + "".join(f", {k} {row[k]}" for k in others)
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
                f"Output throughput per TP size and method, workload {tex_name(workload)}, concurrency {lowest}.",
                errors="95\\% CI",
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
        sub = pareto[pareto["workload"] == workload]
        several = sub["tp"].nunique() > 1
        label = [f"{c}" + (f"/TP{tp}" if several else "") for c, tp in zip(sub["concurrency"], sub["tp"])]
        figs.scatter(
            "concurrency",
            f"pareto-{workload}",
            sub.assign(point=label),
            "interactivity",
            "output_throughput_per_gpu",
            "Interactivity (tokens/s per user)",
            "Output throughput per GPU (tokens/s)",
            f"Throughput per GPU against interactivity (1/TPOT p50), workload {tex_name(workload)}: each method's "
            f"cells joined in order of concurrency{', a line per TP size' if several else ''}, each point labelled "
            f"with its concurrency{' / TP size' if several else ''}; the broad grey line joins the Pareto frontier "
            "(no other cell is better in one of the two and as good in the other).",
            path=["tp", "concurrency"],
            point_label="point",
        )
    has_break_even = _table(t.breakeven, data, "break_even.csv", ["method", "workload", "break_even", "states"])
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
        f"Output throughput against concurrency, {label}.",
        logx=True,
        errors="95\\% CI",
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
        f"Time to first token, 99th percentile, {label}.",
        logx=True,
        errors="95\\% CI",
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
        f"Time per output token, median, {label}.",
        logx=True,
        errors="95\\% CI",
    )


def _read_table(tables_dir: str | Path, name: str, columns: list[str] | None = None) -> pd.DataFrame:
    """An aggregated table (results/<name>.csv) where it exists (those of its ``columns`` it has), else an empty one:
    results aggregated by older code lack the newer tables, and a table of no columns is written as one newline."""
    path = Path(tables_dir) / f"{name}.csv"
    if not path.exists() or path.stat().st_size <= 1:
        return pd.DataFrame(columns=columns or [])
    return pd.read_csv(path, usecols=(lambda c: c in columns) if columns else None)


def skipped_section(tables_dir: str | Path, data: dict[str, str]) -> dict:
    """Section: the cells budget: verdict did not measure (skipped.csv: implied slower, dominated at the smallest
    TP), each with its reason; none where every cell was measured."""
    table = _read_table(tables_dir, "skipped", ["tp", "method", "workload", "concurrency", "reason"])
    shown = table.sort_values(["tp", "method", "workload", "concurrency"]) if len(table) else table
    has = _table(shown, data, "skipped.csv", ["method", "workload", "reason"])
    return {"has_skipped": has, "skipped_count": len(table)}


def slo_section(t: Tables, tables_dir: str | Path, figs: Figures, data: dict[str, str]) -> dict:
    """Section: service-level objectives (slo.csv, the summary's slo_<name>_* columns). Per objective, TP size and
    workload, the share of requests meeting it against concurrency per method with its 95% interval and the
    attainment as a dashed line; and the table of the highest concurrency at which each method meets each objective,
    with its output throughput and goodput per GPU and its share there, and every level's state."""
    table = _read_table(tables_dir, "slo")
    if table.empty:
        return {
            "has_slo": False,
            "slo_everyone": "",
            "slo_objectives": [],
            "slo_attainment": "",
            "slo_least_sessions": 0,
        }
    attainment = float(table["attainment"].iloc[0])
    objectives = list(dict.fromkeys(zip(table["slo"], table["targets"])))
    everyone: dict[str, list[str]] = {}  # objective: the workloads (and TP sizes) where every request met it
    for name, targets in objectives:
        for tp in t.tps:
            for workload in t.summary["workload"].unique():
                if _slo_chart(figs, t.summary, name, targets, attainment, tp, workload) is False:
                    where = tex_name(workload) + (f" at TP {tp}" if len(t.tps) > 1 else "")
                    everyone.setdefault(tex_name(name), []).append(where)
    _slo_table(t.summary, table, figs.methods, data)
    return {
        "has_slo": True,
        "slo_everyone": "; ".join(f"\\texttt{{{name}}} in {', '.join(where)}" for name, where in everyone.items()),
        "slo_objectives": [(tex_name(name), _slo_targets_tex(targets)) for name, targets in objectives],
        "slo_attainment": f"{100 * attainment:g}",
        "slo_least_sessions": math.ceil(Z_975**2 * attainment / (1 - attainment)) if attainment < 1 else 0,
    }


def _slo_targets_tex(targets: str) -> str:
    """An objective's targets ("TTFT <= 2000 ms, TPOT <= 50 ms") for LaTeX."""
    return tex_escape(targets).replace("<=", r"$\le$")


def _slo_chart(
    figs: Figures, summary: pd.DataFrame, name: str, targets: str, attainment: float, tp, workload
) -> bool | None:
    """One objective's share of requests meeting it against concurrency, one TP size and workload, per method;
    False, and no chart, where every request of every cell met it (a chart of lines at 100%: the text says so);
    None where there is no such cell."""
    share = f"slo_{name}_share"
    sub = summary[(summary["tp"] == tp) & (summary["workload"] == workload)]
    if share not in summary or sub.empty:
        return None
    if (sub[share] == 1).all():
        return False
    sub = sub.assign(v=sub[share] * 100, lo=sub[f"{share}_lo"] * 100, hi=sub[f"{share}_hi"] * 100)
    figs.line(
        "slo",
        f"slo-{name}-{workload}-tp{tp}",
        sub,
        "concurrency",
        "v",
        "lo",
        "hi",
        "Concurrency (requests in flight)",
        "Requests meeting the SLO (\\%)",
        f"Share of requests meeting SLO {tex_name(name)} ({_slo_targets_tex(targets)}; a failed request misses it) "
        f"against concurrency, workload {tex_name(workload)}, TP {tp}; dashed line: the attainment, "
        f"{100 * attainment:g}\\%: a point is met where the lower end of its interval lies at or above it.",
        logx=True,
        errors="95\\% Wilson interval at the effective number of requests",
        reference=[
            {
                "label": f"attainment {100 * attainment:g}\\%",
                "text": f"attainment {100 * attainment:g}%",
                "value": 100 * attainment,
            }
        ],
    )
    return True


def _slo_levels(levels: str) -> str:
    """slo.csv's levels ("1 undecided; 4 undecided; 16 met") grouped by state: "met at 16; undecided at 1/4" (no
    comma: the report's CSV files hold none in a field)."""
    by_state: dict[str, list[str]] = {}
    for level in str(levels).split("; "):
        concurrency, _, state = level.partition(" ")
        by_state.setdefault(state, []).append(concurrency)
    return "; ".join(f"{state} at {'/'.join(by_state[state])}" for state in STATES if state in by_state)


def _slo_table(summary: pd.DataFrame, table: pd.DataFrame, methods: list[str], data: dict[str, str]) -> None:
    """slo.csv as the report prints it: the highest concurrency meeting each objective ("$\\ge$16" where that is the
    highest measured: the method meets it at every load tried), throughput and goodput per GPU and the share with its
    interval there, and the levels grouped by state."""
    tested = summary.groupby(["tp", "workload", "method"])["concurrency"].max()
    rank = {m: i for i, m in enumerate(methods)}
    table = table.assign(_rank=table["method"].map(lambda m: rank.get(m, len(rank))))
    table = table.sort_values(["tp", "workload", "slo", "_rank"], kind="stable")
    highest = []
    for row in table.to_dict("records"):
        if pd.isna(row["highest_concurrency"]):
            highest.append("--")
        else:
            top = int(row["highest_concurrency"])
            every = top == tested.get((row["tp"], row["workload"], row["method"]))
            highest.append(f"$\\ge${top}" if every else str(top))
    shown = pd.DataFrame(
        {
            "tp": table["tp"],
            "workload": table["workload"],
            "slo": table["slo"],
            "method": table["method"],
            "highest": highest,
            "throughput": table["output_throughput_per_gpu"],
            "goodput": table["goodput_per_gpu"],
            "share": [_with_interval(*values) for values in zip(table["share"], table["share_lo"], table["share_hi"])],
            "levels": table["levels"].map(_slo_levels),
        }
    )
    _table(shown, data, "slo.csv", ["workload", "slo", "method", "levels"])


def _with_interval(ratio, lo, hi) -> str:
    """A ratio over its 95% interval as the engines table prints them (TeX, two lines in one cell, so that the table
    fits the page): "1.120" over "[1.080; 1.160]", [--] where it has no interval, -- where there is no ratio."""
    if ratio is None or pd.isna(ratio):
        return "--"
    interval = "[--]" if lo is None or pd.isna(lo) or hi is None or pd.isna(hi) else f"[{lo:.3f}; {hi:.3f}]"
    return rf"\twolines{{{ratio:.3f}}}{{{interval}}}"


def _paired_ratio_cells(frame: pd.DataFrame) -> dict[str, list[str]]:
    """The throughput, TPOT p50 and TTFT p50 columns of a table of paired ratios (aggregate's engines and width
    cliff tables) as printed: each ratio over its 95% interval (_with_interval)."""
    return {
        label: [
            _with_interval(*values)
            for values in zip(frame[f"{m}_ratio"], frame[f"{m}_ratio_lo"], frame[f"{m}_ratio_hi"])
        ]
        for label, m in (("throughput", "output_throughput"), ("tpot", "tpot_p50"), ("ttft", "ttft_p50"))
    }


def _differs(value) -> str:
    """The engines table's differs column as printed: yes, no, or -- where nothing was compared."""
    return "--" if pd.isna(value) else "yes" if str(value) == "True" else "no"


def engines_section(tables_dir: str | Path, data: dict[str, str]) -> dict:
    """Section: each cell on an engine against the same cell on the reference engine (aggregate.engine_comparison),
    where the configuration has two or more engines; a row not compared (a side not final, no session completed
    on both), or one that is one measurement under two names (engines of one build and settings), is marked with the
    number of its reason, and the reasons are listed under the table."""
    frame = _read_table(tables_dir, "engines")
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
            **_paired_ratio_cells(frame),
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
        .agg(
            family=("family", "first"), sessions=("sessions", verdict.count_span), content_mix=("content_mix", "first")
        )
        .reset_index()
    )  # sessions: those its cells measured, the fewest to the most (a cell's grow with its concurrency)
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
    # waiting for a slot is open-loop load's (poisson; a trace's replay, whatever load.model says: a cell with a
    # trace column): under closed loop a late client (host jitter) is no wait
    traced = summary["trace"].fillna("").astype(str) != "" if "trace" in summary else False
    open_loop = (view["load_model"] != "closed") | traced
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
        ("Server", verdict.engine_text(environment)),
        ("Python", environment["software"]["python"]),
        ("specsweep", environment["software"]["specsweep"]),
        ("Snakemake", environment["software"].get("snakemake")),
        (
            "GPUs",
            verdict.gpus_text(environment)
            if environment["backend"] == "external"  # the servers' GPUs: not reported (the client's run none)
            else ", ".join(g["name"] for g in environment["hardware"]["gpus"]) or "none",
        ),
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
                text += " (random weights of the model's shape: what acceptance then measures is in the caveats)"
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
        **verdict_page(tables_dir, t, environment, view, data),
        **single_stream(t, figs),
        **budget_sweep(t, figs, data),
        **tensor_parallelism(t, figs, data),
        **concurrency(t, figs, data),
        **slo_section(t, tables_dir, figs, data),
        **agentic(t, figs, data),
        **engines_section(tables_dir, data),
        **skipped_section(tables_dir, data),
        **content_kinds(t, figs, data, tables_dir),
        **acceptance_per_depth(t, figs, data, tables_dir),
        **ddtree_stages(tables_dir, data),
        **width_cliff(tables_dir, data),
        **forced_break_even(t, tables_dir, data),
        **setup_tables(t, environment, view, simulated, data),
        **plan_against_runs(
            predictions
            if predictions is not None
            else pd.DataFrame(columns=["server", "path", "startup_s", "warmup_s", "measure_s"]),
            runs or {},
            data,
        ),
    }
    by_section = {key: [s for s in figs.specs if s["section"] == key] for key in [*SECTIONS, *SUBSECTIONS]}
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
        **_methodology(view),
    }
    return context, dict(sorted(data.items()))


def _methodology(view: dict) -> dict:
    """What the methodology section states: the warm-up (and whether it filled a wave: "all", "some" or None), the
    bootstrap's resamples, the metrics' definitions and statistics, the fewest sessions behind a number."""
    return {
        "warmup": view["warmup"],
        "warmup_fill": view.get("warmup_fill"),
        "resamples": BOOTSTRAP_RESAMPLES,
        "definitions": [(tex_escape(n), tex_escape(d)) for n, d in definitions()],
        "statistics": [(tex_escape(n), tex_escape(d)) for n, d in statistics()],
        "min_sessions": MIN_SESSIONS,
    }


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
    """The report's LaTeX from its context, stamped with the code rendering it now (renderer_stamp)."""
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
    env.globals["palette"] = PALETTE  # the methods' colours, defined once in the preamble
    return env.get_template("report.tex.j2").render(**{"renderer": tex_escape(renderer_stamp()), **ctx})


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
    tex.write_text(render_tex(ctx))
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
        for spec in section_figures(ctx, section):
            fig = draw_figure(plt, spec, csv)
            if ctx["simulated"]:
                fig.suptitle("SIMULATED BACKEND: not measured on GPUs", color="darkred", fontsize=10)
            below = 0.45 / fig.get_figheight() if spec["kind"] == "grid" else 0  # a grid's legend, below its panels
            fig.tight_layout(rect=(0, below, 1, 1))
            fig.savefig(Path(folder) / f"{spec['id']}.png", dpi=100)
            plt.close(fig)
    if "verdict" in out_dirs:  # the verdict's heatmap: no figure spec of its own (verdict_page typesets it)
        verdict_figures(data_json, out_dirs["verdict"])


def section_figures(ctx: dict, section: str) -> list[dict]:
    """A section's figures, then those of its subsections (layout.REPORT_SUBSECTIONS): what the HTML report shows
    under its category."""
    subsections = [key for key, parent in SUBSECTIONS.items() if parent == section]
    return [spec for key in [section, *subsections] for spec in ctx["figures"].get(key, [])]


def draw_figure(plt, spec: dict, csv: dict[str, str]):
    """One figure spec as a matplotlib figure (a grid of panels, one legend below them, or one chart with its
    legend below it), each series in its style."""
    panels = spec["panels"] if spec["kind"] == "grid" else [spec]
    columns = spec.get("columns", 1) if spec["kind"] == "grid" else 1
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(7, 4.2) if rows * columns == 1 else (7, 0.4 + 2.4 * rows))
    axes = [axes] if rows * columns == 1 else list(axes.flat)
    for n, (ax, panel) in enumerate(zip(axes, panels)):
        _draw(ax, panel, _read_chart(csv[Path(panel["csv"]).name]))
        ax.set_xlabel(_plain(panel["xlabel"]) if n >= len(panels) - columns or spec["kind"] != "grid" else "")
        ax.set_ylabel(_plain(panel["ylabel"]))
        ax.set_title(textwrap.fill(_plain(panel.get("title", "")), 36), fontsize=9)  # a long name wraps
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if spec["kind"] == "grid":
        handles = [_proxy(s) for s in spec["series"]] + [_proxy(r, dashed=True) for r in spec["reference"]]
        labels = spec["labels"] + [r["text"] for r in spec["reference"]]
        fig.legend(handles, labels, fontsize=8, ncol=spec["legend_columns"], loc="lower center", frameon=False)
    else:
        entries = len(spec["labels"]) + len(spec.get("reference") or []) + (spec["kind"] == "scatter")
        axes[0].legend(
            fontsize=8,
            ncol=min(spec["legend_columns"], entries),
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            frameon=False,
        )
    return fig


def _read_chart(text: str) -> pd.DataFrame:
    """A chart's CSV text as written (_spec): numbers, NaN as "nan", point labels (t<i>) as text."""
    header = text.split("\n", 1)[0].split(",")
    labels = {c: str for c in header if re.fullmatch(r"t\d+", c)}
    return pd.read_csv(io.StringIO(text), dtype=labels, keep_default_na=False, na_values=["nan"])


def _plain(tex: str) -> str:
    """A label's TeX as matplotlib shows it: escapes and break points dropped."""
    return re.sub(r"\\allowbreak\{\}|\\penalty200\{\}|\{\}", "", tex).replace("\\%", "%").replace("\\_", "_")


def _proxy(style: dict, dashed: bool = False):
    """A legend handle in a series' style. Imported here: matplotlib.lines (heavy, needed by the figures job
    alone; plot_figures chose its backend)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], **_mpl(style, dashed))


def _mpl(style: dict, dashed: bool = False) -> dict:
    """A series' style as matplotlib's keywords."""
    if dashed:
        return {"color": style["rgb"], "linestyle": "--"}
    return {
        "color": style["rgb"],
        "marker": style["marker"],
        "linestyle": style["linestyle"],
        "markerfacecolor": style["rgb"] if style["filled"] else "white",
    }


def _draw(ax, spec: dict, data: pd.DataFrame) -> None:
    """One chart (or one panel of a grid) of a spec on a matplotlib axis, each series in its style (_mpl): lines with
    their error bars, joins and reference lines; bars; or points joined per series and labelled, over the Pareto
    frontier; log axes and axes from 0 as the spec says. Imported here: matplotlib.colors and matplotlib.ticker
    (heavy, needed by the figures job alone; plot_figures chose its backend)."""
    from matplotlib.colors import to_rgba
    from matplotlib.ticker import NullLocator

    if spec["kind"] == "line":
        for j in spec.get("joins") or []:
            ax.plot(data[spec["x"]].where(data[j].notna()).dropna(), data[j].dropna(), color="0.6", linewidth=0.8)
        for s in spec["series"]:
            err = [data[f"{s['col']}_minus"], data[f"{s['col']}_plus"]] if s["error_bars"] else None
            ax.errorbar(data[spec["x"]], data[s["col"]], yerr=err, capsize=3, label=s["text"], **_mpl(s))
        for r in spec.get("reference") or []:
            ax.axhline(r["value"], label=r["text"], **_mpl(r, dashed=True))
        if spec.get("logx"):
            ax.set_xscale("log", base=2)
        ax.set_xticks(data[spec["x"]], [f"{v:g}" for v in data[spec["x"]]])  # as the PDF: the values measured
        ax.xaxis.set_minor_locator(NullLocator())
    elif spec["kind"] == "bar":
        width = 0.8 / max(1, len(spec["series"]))
        for i, s in enumerate(spec["series"]):
            err = [data[f"{s['col']}_minus"], data[f"{s['col']}_plus"]] if s["error_bars"] else None
            offset = (i - (len(spec["series"]) - 1) / 2) * width
            face = to_rgba(s["rgb"], 0.6)  # as the PDF's bars: the colour at 60% over white, its edge at full
            x = data["x"] + offset
            ax.bar(x, data[s["col"]], width, yerr=err, capsize=3, label=s["text"], color=face, edgecolor=s["rgb"])
        ax.set_xticks(range(len(spec["xlabels"])), spec["xlabels"])
        if spec.get("baseline") is not None:
            ax.axhline(spec["baseline"], linestyle="--", color="black")
    else:
        _draw_scatter(ax, spec, data)
    _scales(ax, spec)


def _draw_scatter(ax, spec: dict, data: pd.DataFrame) -> None:
    """The Pareto chart: the frontier as a broad grey line beneath, each series' points joined (where the spec says)
    and labelled with their t<i> text."""
    ax.plot(
        data["fx"], data["fy"], color="0.78", linewidth=7, solid_capstyle="round", zorder=0, label="Pareto frontier"
    )
    for s in spec["series"]:
        n = s["n"]
        style = _mpl(s) if spec.get("joined") else {**_mpl(s), "linestyle": "none"}
        ax.plot(data[f"x{n}"], data[f"y{n}"], label=s["text"], markersize=5, **style)
        if spec.get("point_labels"):
            for x, y, text in zip(data[f"x{n}"], data[f"y{n}"], data[f"t{n}"]):
                if pd.notna(x) and pd.notna(y):
                    ax.annotate(
                        str(text), (x, y), xytext=(2, 2), textcoords="offset points", fontsize=6, color=s["rgb"]
                    )


def _scales(ax, spec: dict) -> None:
    """A chart's y axis (and a scatter's x axis) as the spec chose: log, or linear from 0. Imported here:
    matplotlib.ticker (heavy, needed by the figures job alone; plot_figures chose its backend)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if spec.get("logy"):
        ax.set_yscale("log")
        ticks = [float(v) for v in spec["yticks"].split(",")]
        ax.set_yticks(ticks)
        ax.set_ylim(bottom=ticks[0])
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    if spec["kind"] == "scatter":
        if spec.get("logx"):
            ax.set_xscale("log")
            ticks = [float(v) for v in spec["xticks"].split(",")]
            ax.set_xticks(ticks)
            ax.set_xlim(left=ticks[0])
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_xlim(left=0)


# ---- the verdict page: page 1 after the title (verdict.py decides; this typesets) ----------------------------------

HEAT_FULL = 2.0  # |log2 speedup| at which a heatmap cell's colour is deepest: 4x faster or slower
HEAT_NAMES_CM = 2.9  # a heatmap's column of method names at most (a longer name wraps)
# the stamp's frame and fill by its first flag (MEASURED: green)
STAMP_COLORS = {"SIMULATED": ("red!70!black", "red!5"), "DUMMY WEIGHTS": ("orange!80!black", "orange!5")}
STAMP_COLORS["ACCEPTANCE FORCED"] = STAMP_COLORS["DUMMY WEIGHTS"]


def _footer(flags: list[str]) -> str:
    """What every page's footer says of the stamp's flags: SIMULATED BACKEND: not measured on GPUs (and the other
    flags), or the flags and that acceptance and speedups are not a model's; nothing for a measured run."""
    if "SIMULATED" in flags:
        return " / ".join(["SIMULATED BACKEND: not measured on GPUs"] + [f for f in flags if f != "SIMULATED"])
    shown = [f for f in flags if f != "MEASURED"]
    return " / ".join(shown) + ": acceptance and speedups are not a model's" if shown else ""


def _json_ready(value):
    """A value for data.json: NaN and infinities as None, numpy scalars as Python's, containers walked."""
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return None if value is pd.NA else value


def _temperature(frame: pd.DataFrame, view: dict) -> str:
    """The sampling temperature as the workload line says it: from the cells, else from the configuration."""
    temps = sorted(set(pd.to_numeric(frame["temperature"], errors="coerce").dropna())) if "temperature" in frame else []
    if not temps:
        return (view.get("sampling") or "temperature not recorded").split(",")[0]
    if temps == [0]:
        return "temperature 0 (greedy) only"
    return "temperature " + ", ".join(f"{t:g}" for t in temps)


def verdict_page(tables_dir: str | Path, t: Tables, environment: dict, view: dict, data: dict[str, str]) -> dict:
    """Page 1 after the title: the stamp with its caveats, the verdict table, the speedup heatmap, the findings, the
    workload and confidence lines (each decided and written by verdict.py from the aggregated tables); the same in
    plain text under ``verdict`` for the HTML report (verdict_html)."""
    frame = t.summary
    launches = _read_table(tables_dir, "summary")
    requests = _read_table(
        tables_dir,
        "requests",
        ["tp", "method", "workload", "concurrency", "repetition", "session", "error", "prompt_tokens", "output_tokens"],
    )
    table = verdict.verdict_table(frame)
    breakeven = t.breakeven if "break_even" in t.breakeven else verdict.break_even(frame)
    dates = list(launches["finished_at"]) if "finished_at" in launches else []
    builds = _read_table(tables_dir, "engine_builds")
    engines = verdict.engines_text(builds)
    stamp = verdict.stamp(frame, environment, view["model"], dates, view.get("sim_profile", ""), t.pareto, engines)
    panels = verdict.heatmap_panels(frame, view.get("methods", []))
    has_ar = bool(frame["speedup"].notna().any()) if len(frame) else False  # no AR: no speedup, no verdict
    if not has_ar:
        table, panels = table.iloc[0:0], []
    plain = {
        "stamp": stamp,
        "table": table.to_dict("records"),
        "findings": verdict.findings(frame, table, breakeven),
        "workloads": verdict.workload_lines(frame, requests, _temperature(frame, view)),
        "confidence": verdict.confidence_line(frame, launches, requests),
        "panels": [
            {**p, "cells": [{"method": m, "concurrency": c, **v} for (m, c), v in p["cells"].items()]} for p in panels
        ],
    }
    flags = stamp["flags"]
    color, fill = next((STAMP_COLORS[f] for f in flags if f in STAMP_COLORS), ("green!40!black", "green!5"))
    return {
        "verdict": _json_ready(plain),
        "stamp_flags": " / ".join(flags),
        "stamp_color": color,
        "stamp_fill": fill,
        "stamp_text": tex_escape(stamp["text"]),
        "stamp_caveats": [tex_escape(c) for c in stamp["caveats"]],
        "footer_flags": _footer(flags),
        "has_verdict": _verdict_table(table, data),
        "verdict_slo": bool(table["slo"].astype(str).str.len().gt(0).any()) if len(table) else False,
        "verdict_artefacts": bool(table["artefact"].any()) if len(table) else False,
        "heat_panels": _heat_panels(panels, data),
        "findings": [tex_escape(f) for f in plain["findings"]],
        "workload_lines": [tex_escape(w) for w in plain["workloads"]],
        "confidence": tex_escape(plain["confidence"]),
    }


def _speedup_cell(value, lo, hi) -> str:
    """A speedup over its 95% interval, two lines of one table cell: "1.52" over "[1.40; 1.65]" ("[no interval]")."""
    if pd.isna(value):
        return "--"
    interval = "[no interval]" if pd.isna(lo) or pd.isna(hi) else f"[{lo:.2f}; {hi:.2f}]"
    return rf"\twolines{{{value:.2f}}}{{{interval}}}"


def _verdict_table(table: pd.DataFrame, data: dict[str, str]) -> bool:
    """The verdict table's CSV (verdict.csv; names escaped, a dagger on a best method whose acceptance is an
    artefact, times in ms); whether it has rows."""
    shown = pd.DataFrame(
        {
            "tp": table["tp"],
            "workload": table["workload"].map(tex_name),
            "concurrency": table["concurrency"],
            "best": [tex_name(m) + (r"\dag" if a else "") for m, a in zip(table["best"], table["artefact"])],
            "speedup": [_speedup_cell(*v) for v in zip(table["speedup"], table["speedup_lo"], table["speedup_hi"])],
            "verdict": table["verdict"],
            "deploy": [
                r"\emph{undecided}" if d == verdict.UNDECIDED else tex_name(d) + (r"\dag" if a and d == b else "")
                for d, b, a in zip(table["deploy"], table["best"], table["artefact"])
            ],
            "throughput_per_gpu": table["output_throughput_per_gpu"],
            "tpot_p50_ms": table["tpot_p50"] * 1000,
            "ttft_p99_ms": table["ttft_p99"] * 1000,
            "acceptance_length": table["acceptance_length"],
            "slo_met": [_slos_met(v) for v in table["slo"]],
        }
    )
    data["verdict.csv"] = shown.to_csv(index=False)
    return not shown.empty


def _slos_met(states: str) -> str:
    """The verdict table's SLO column: the names of the SLOs the best method meets, an undecided one with "?", "none"
    where it meets none ("" where no SLO is configured)."""
    pairs = [part.rsplit(" ", 1) for part in states.split("; ") if part] if isinstance(states, str) else []
    shown = [tex_name(n) + ("?" if s == "undecided" else "") for n, s in pairs if s in ("met", "undecided")]
    return " ".join(shown) if shown else ("none" if pairs else "")


def _heat_cell(cell: dict | None) -> str:
    """A heatmap cell as the template's macros draw it: \\heatF{depth}{label} (faster, blue, an up triangle),
    \\heatS{depth}{label} (slower, orange, a down triangle), \\heatI{label} (inconclusive: hatched, a question
    mark); the label is the speedup, a dagger where the acceptance is an artefact; "" where the method did not run."""
    if cell is None:
        return ""
    s = cell["speedup"]
    label = "--" if s is None else f"{s:.1f}" if s >= 10 else f"{s:.2f}"
    label += r"\dag" if cell["artefact"] else ""
    if cell["verdict"] == verdict.INCONCLUSIVE or s is None or s <= 0:
        return rf"\heatI{{{label}}}"
    depth = round(12 + 48 * min(1.0, abs(math.log2(s)) / HEAT_FULL))
    return rf"\heat{'F' if cell['verdict'] == verdict.FASTER else 'S'}{{{depth}}}{{{label}}}"


def _heat_panels(panels: list[dict], data: dict[str, str]) -> list[dict]:
    """One CSV per heatmap panel (a row per method, a column c<concurrency> per concurrency) and what the template
    needs to set it: its file, title and columns (the template sets panels side by side where they fit)."""
    out = []
    for p in panels:
        name = f"verdict-heat-{p['workload']}-tp{p['tp']}.csv"
        rows = [
            {"method": tex_name(m), **{f"c{c}": _heat_cell(p["cells"].get((m, c))) for c in p["concurrencies"]}}
            for m in p["methods"]
        ]
        data[name] = pd.DataFrame(rows, columns=["method", *(f"c{c}" for c in p["concurrencies"])]).to_csv(index=False)
        out.append(
            {
                "csv": f"data/{name}",
                "title": f"{tex_name(p['workload'])}, TP {p['tp']}",
                "concurrencies": p["concurrencies"],
                "columns": ",".join(["method", *(f"c{c}" for c in p["concurrencies"])]),
                "names_cm": HEAT_NAMES_CM,
            }
        )
    return out


HEAT_CMAP = ["#e08000", "#ffffff", "#1f3fbf"]  # slower (orange) through 1 (white) to faster (blue), as in the PDF
VERDICT_MARKS = {verdict.FASTER: "\u25b2", verdict.SLOWER: "\u25bc", verdict.INCONCLUSIVE: "?"}
DAGGER = "\u2020"  # a speedup whose acceptance is an artefact


def draw_verdict_heatmap(panels: list[dict], simulated: bool):
    """The speedup heatmap as a matplotlib figure (the PDF's figure of the verdict page): a panel per workload and
    TP, methods down, concurrencies across; each cell coloured by log2 speedup (blue faster, orange slower, deepest
    at HEAT_FULL), labelled with its mark (up triangle faster, down triangle slower, ? inconclusive) and speedup,
    inconclusive cells hatched. ``panels``: verdict.heatmap_panels's, their cells as a list (data.json). Imported
    here: matplotlib (heavy, needed by the figure jobs alone; plot_figures chose its backend)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.patches import Rectangle

    cmap = LinearSegmentedColormap.from_list("speedup", HEAT_CMAP)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(4.0, 2.6 * len(panels) + 1.5), 0.45 * max(len(p["methods"]) for p in panels) + 1.8)
    )
    for ax, p in zip([axes] if len(panels) == 1 else axes, panels):
        cells = {(c["method"], c["concurrency"]): c for c in p["cells"]}
        for i, method in enumerate(p["methods"]):
            for j, conc in enumerate(p["concurrencies"]):
                cell = cells.get((method, conc))
                if cell is None:
                    continue
                s = cell["speedup"]
                decided = cell["verdict"] != verdict.INCONCLUSIVE and s is not None and s > 0
                level = min(1.0, max(-1.0, math.log2(s) / HEAT_FULL)) if decided else 0.0
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=cmap((0.75 * level + 1) / 2), edgecolor="white"))
                if not decided:
                    ax.add_patch(Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="#9a9a9a", linewidth=0))
                label = "--" if s is None else f"{s:.1f}" if s >= 10 else f"{s:.2f}"
                text = f"{VERDICT_MARKS[cell['verdict']]} {label}{DAGGER if cell['artefact'] else ''}"
                box = None if decided else {"facecolor": "white", "edgecolor": "none", "pad": 1}
                ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8, bbox=box)
        ax.set_xlim(0, len(p["concurrencies"]))
        ax.set_ylim(len(p["methods"]), 0)
        ax.set_xticks([j + 0.5 for j in range(len(p["concurrencies"]))], [str(c) for c in p["concurrencies"]])
        ax.set_yticks([i + 0.5 for i in range(len(p["methods"]))], p["methods"], fontsize=8)
        ax.set_xlabel("Concurrency")
        ax.set_title(f"{p['workload']}, TP {p['tp']}", fontsize=10)
        ax.tick_params(length=0)
    caption = "\u25b2 faster (95% interval above 1)   \u25bc slower (below 1)   ? hatched: inconclusive"
    if any(c["artefact"] for p in panels for c in p["cells"]):
        caption += f"   {DAGGER} acceptance that is an artefact"
    fig.text(0.5, 0.01, caption, ha="center", fontsize=8)
    if simulated:
        fig.suptitle("SIMULATED BACKEND: not measured on GPUs", color="darkred", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def verdict_figures(data_json: str, folder: str | Path) -> None:
    """The verdict page's heatmap as a PNG for Snakemake's HTML report (none without a speculative cell). Imported
    here: matplotlib (heavy, needed by this job alone, and its backend must be chosen before pyplot is imported)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx, _ = read_report_data(data_json)
    Path(folder).mkdir(parents=True, exist_ok=True)
    panels = ctx["verdict"]["panels"]
    if panels:
        fig = draw_verdict_heatmap(panels, ctx["simulated"])
        fig.savefig(Path(folder) / "speedup-heatmap.png", dpi=100)
        plt.close(fig)


VERDICT_CSS = """body{font-family:sans-serif;max-width:70em;margin:1em auto;color:#222}
.stamp{border:2px solid #2e7d32;background:#f1f8f1;padding:.6em 1em;margin:1em 0}
.stamp.warn{border-color:#b34700;background:#fff5eb}.stamp.sim{border-color:#a31515;background:#fdf0f0}
.flags{font-weight:bold;color:#a31515}table{border-collapse:collapse;font-size:.9em}
th,td{border-bottom:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}
td.name,th.name{text-align:left}.faster{color:#1f3fbf;font-weight:bold}.slower{color:#b34700;font-weight:bold}
.caption{font-size:.9em;color:#444}"""


def verdict_html(ctx: dict, heatmap_png: bytes | None = None) -> str:
    """The verdict as one self-contained HTML page for Snakemake's report: the stamp and its caveats, the verdict
    table, the heatmap (``heatmap_png``, inlined), the findings, the workload and confidence lines, from the report's
    context (verdict_page's plain text)."""
    v = ctx["verdict"]
    stamp = v["stamp"]
    kind = "sim" if "SIMULATED" in stamp["flags"] else "warn" if stamp["flags"] != ["MEASURED"] else ""
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Verdict</title><style>{VERDICT_CSS}</style>"
        "</head><body><h1>Verdict</h1>",
        f"<div class='stamp {kind}'><span class='flags'>{escape(' / '.join(stamp['flags']))}.</span> "
        f"{escape(stamp['text'])}" + "".join(f"<p>{escape(c)}</p>" for c in stamp["caveats"]) + "</div>",
        _verdict_html_table(v["table"]),
    ]
    if heatmap_png:
        parts.append(
            "<h2>Speedup over AR</h2><img alt='speedup heatmap' src='data:image/png;base64,"
            + base64.b64encode(heatmap_png).decode()
            + "'><p class='caption'>A panel per workload and TP: methods down, concurrencies across. \u25b2 faster "
            "(paired 95% interval above 1), \u25bc slower (below 1), hatched ? inconclusive (contains 1, or none); "
            f"{DAGGER} acceptance that is an artefact.</p>"
        )
    parts.append("<h2>Findings</h2><ol>" + "".join(f"<li>{escape(f)}</li>" for f in v["findings"]) + "</ol>")
    parts.append("<h2>Workloads</h2><ul>" + "".join(f"<li>{escape(w)}</li>" for w in v["workloads"]) + "</ul>")
    parts.append(f"<h2>Confidence</h2><p>{escape(v['confidence'])}</p></body></html>")
    return "\n".join(parts)


def _verdict_html_table(rows: list[dict]) -> str:
    """The verdict table in HTML (see verdict.verdict_table), or why there is none."""
    if not rows:
        return "<p>No verdict: no speculative cell was compared with AR.</p>"

    def num(value, scale=1.0, digits=2):
        return "--" if value is None else f"{value * scale:,.{digits}f}"

    head = (
        "<tr><th>TP</th><th class='name'>Workload</th><th>Conc.</th><th class='name'>Best</th>"
        "<th>Speedup [95% CI]</th><th class='name'>Verdict</th><th class='name'>Deploy</th><th>Tok/s per GPU</th>"
        "<th>TPOT p50 (ms)</th><th>TTFT p99 (ms)</th><th>Accept. length</th><th class='name'>SLOs</th></tr>"
    )
    body = []
    for r in rows:
        interval = (
            "no interval"
            if r["speedup_lo"] is None or r["speedup_hi"] is None
            else (f"{r['speedup_lo']:.2f}; {r['speedup_hi']:.2f}")
        )
        body.append(
            f"<tr><td>{r['tp']}</td><td class='name'>{escape(str(r['workload']))}</td><td>{r['concurrency']}</td>"
            f"<td class='name'>{escape(str(r['best']))}{DAGGER if r['artefact'] else ''}</td>"
            f"<td>{num(r['speedup'])} [{interval}]</td><td class='name {r['verdict']}'>{r['verdict']}</td>"
            f"<td class='name'>{escape(str(r['deploy']))}</td><td>{num(r['output_throughput_per_gpu'], digits=0)}</td>"
            f"<td>{num(r['tpot_p50'], 1000)}</td><td>{num(r['ttft_p99'], 1000, 1)}</td>"
            f"<td>{num(r['acceptance_length'])}</td><td class='name'>{escape(r['slo'] or '--')}</td></tr>"
        )
    caption = (
        "<p class='caption'>Best: the speculative method with the highest output throughput in the cell (point "
        "estimate). Speedup: its output throughput over AR's with the paired 95% interval; verdict from that "
        "interval: faster (above 1), slower (below 1), inconclusive (contains 1, or none). Deploy: the best method "
        "where faster, AR where even it is slower, else a method decided faster if any, else undecided.</p>"
    )
    return f"<h2>Verdict per TP, workload and concurrency</h2>{caption}<table>{head}{''.join(body)}</table>"


def write_verdict_html(data_json: str, out_html: str) -> None:
    """The verdict page of Snakemake's HTML report (verdict_html), its heatmap drawn here. Imported here:
    matplotlib (heavy, needed by this job alone, and its backend must be chosen before pyplot is imported)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx, _ = read_report_data(data_json)
    png = None
    if ctx["verdict"]["panels"]:
        fig = draw_verdict_heatmap(ctx["verdict"]["panels"], ctx["simulated"])
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        plt.close(fig)
        png = buffer.getvalue()
    atomic_write_text(out_html, verdict_html(ctx, png))
