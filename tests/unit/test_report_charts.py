"""The report's charts: one colour and mark per method in every figure of both renderers, log axes where values span
more than a decade, captions that announce error bars only where some are drawn, Pareto curves joined per method in
order of concurrency, draft-size sweeps as small multiples. The run: the committed H200 record (seven methods, two
workloads, concurrency 1 to 64, NGRAM and EAGLE-3 at two sizes each)."""

from __future__ import annotations

import io
import json
import math
import re

import matplotlib
import pandas as pd
import pytest

from conftest import REPO
from specsweep import aggregate, report, verdict

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

RECORD = REPO / "benchmarks" / "gpu" / "spec-2026-12-01"
METHODS = ["ar", "dflash", "ngram-d8", "ngram-d32", "eagle3-chain", "eagle3-tree", "standalone"]


def tables_of(summary: pd.DataFrame, folder):
    """The aggregated tables prepare() reads, from one row per cell."""
    summary.to_csv(folder / "combined.csv", index=False)
    pd.DataFrame(columns=["tp", "method", "workload", "concurrency", "turn"]).to_csv(folder / "turns.csv", index=False)
    aggregate.best_budget(summary).to_csv(folder / "best_budget.csv", index=False)
    verdict.break_even(summary).to_csv(folder / "break_even.csv", index=False)
    aggregate.pareto(summary).to_csv(folder / "pareto.csv", index=False)
    return folder


def prepared(folder, methods=METHODS):
    environment = json.loads((RECORD / "environment.json").read_text())
    view = {"title": "t", "author": "a", "model": "Qwen3-8B", "methods": methods, "warmup": 2, "load_model": "closed"}
    return report.prepare(folder, environment, view)


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """(context, CSV texts) of the record's report, and its specs one by one (grids' panels included)."""
    folder = tables_of(pd.read_csv(RECORD / "summary.csv"), tmp_path_factory.mktemp("tables"))
    ctx, csv = prepared(folder)
    return ctx, csv


def every_spec(ctx) -> list[dict]:
    return [spec for section in ctx["figures"].values() for spec in section]


def charts(ctx) -> list[dict]:
    """Every chart drawn on one axis: figures, and each panel of a grid."""
    return [p for spec in every_spec(ctx) for p in (spec["panels"] if spec["kind"] == "grid" else [spec])]


def styles_by_method(ctx) -> dict[str, set]:
    """Each method's styles as the figure specs give them (its series, and its reference lines in sweeps)."""
    seen: dict[str, set] = {}
    for chart in charts(ctx):
        for s in chart["series"]:
            seen.setdefault(s["name"], set()).add((s["color"], s["rgb"], s["mark"], s["marker"], s["dash"]))
        for r in chart.get("reference") or []:
            seen.setdefault(r["text"].lower(), set()).add((r["color"], r["rgb"], r["mark"], r["marker"], r["dash"]))
    return seen


def test_each_method_has_one_colour_and_mark_in_every_figure_and_no_two_share_them(record):
    ctx, _ = record
    seen = styles_by_method(ctx)
    assert set(seen) == set(METHODS)
    assert all(len(styles) == 1 for styles in seen.values()), seen
    looks = [next(iter(styles)) for styles in seen.values()]
    assert len({(c, m) for c, _, m, _, _ in looks}) == len(METHODS)
    assert len({c for c, *_ in looks}) == len(METHODS)  # seven methods: seven colours
    # the speedup chart leaves AR out: DFlash keeps the colour it has where AR is drawn
    speedup = next(s for s in every_spec(ctx) if s["id"] == "single-speedup-tp1")
    throughput = next(s for s in every_spec(ctx) if s["id"] == "single-throughput-tp1")
    colour = {s["name"]: s["color"] for s in throughput["series"]}
    assert "ar" not in {s["name"] for s in speedup["series"]}
    assert all(colour[s["name"]] == s["color"] for s in speedup["series"])


def test_the_pdf_draws_each_series_in_its_methods_colour_and_mark(record):
    ctx, _ = record
    tex = report.render_tex(ctx)
    for name, rgb in report.PALETTE:
        assert f"\\definecolor{{{name}}}{{HTML}}{{{rgb}}}" in tex
    dflash = report.method_style("dflash", METHODS)
    drawn = re.findall(r"\\addplot\[(\w+),(\w[\w ]*),mark=([\w*]+),", tex)
    assert (dflash["color"], dflash["dash"], dflash["mark"]) in drawn
    assert {c for c, _, _ in drawn} == {report.method_style(m, METHODS)["color"] for m in METHODS}
    assert "cycle list" not in tex  # no colour from a series' place in its chart


def test_the_png_draws_each_series_in_its_methods_colour(record):
    ctx, csv = record
    checked = set()
    for spec in every_spec(ctx):
        fig = report.draw_figure(plt, spec, csv)
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                name = label.split(" (")[0].lower()
                if name in METHODS:
                    artist = handle.patches[0] if hasattr(handle, "patches") else getattr(handle, "lines", [handle])[0]
                    colour = artist.get_facecolor() if hasattr(handle, "patches") else artist.get_color()
                    assert to_hex(colour) == report.method_style(name, METHODS)["rgb"].lower(), (spec["id"], label)
                    checked.add((spec["kind"], name))
        plt.close(fig)
    assert {kind for kind, _ in checked} == {"line", "bar", "scatter", "grid"}
    assert {name for _, name in checked} == set(METHODS)


def test_a_method_keeps_its_style_whatever_else_is_configured_and_more_than_ten_stay_apart():
    methods = [f"m{i}" for i in range(63)]
    looks = [report.method_style(m, methods) for m in methods]
    assert len({(s["color"], s["mark"]) for s in looks}) == 63  # colour x mark: no two alike
    assert len({s["color"] for s in looks[:7]}) == 7 and len({s["mark"] for s in looks[:9]}) == 9
    assert {s["dash"] for s in looks[:7]} == {"solid"} and looks[7]["dash"] != "solid"
    assert report.method_style("m3", methods) == report.method_style("m3", methods[:5])
    with pytest.raises(report.ReportError, match="'nope' is not one of the configured methods"):
        report.method_style("nope", methods)


def line_spec(values, lows=None):
    figs = report.Figures({}, ["ar", "dflash"])
    frame = pd.DataFrame(
        {
            "method": ["ar"] * len(values) + ["dflash"] * len(values),
            "concurrency": [1, 4, 16, 64][: len(values)] * 2,
            "v": values + [v * 1.5 for v in values],
        }
    )
    frame["lo"] = frame["v"] - (frame["v"] - lows if lows is not None else 0)
    figs.line("concurrency", "c", frame, "concurrency", "v", "lo", "v", "C", "V", "Cap.", logx=True, errors="95\\% CI")
    return figs.specs[0]


def test_a_value_axis_is_logarithmic_where_values_span_more_than_ten_times_and_starts_at_zero_otherwise(record):
    spanning = line_spec([50.0, 200.0, 900.0, 4000.0])  # 50 to 6,000 ms
    assert spanning["logy"] and spanning["yticks"] == "50,100,200,500,1000,2000,5000"
    assert not line_spec([50.0, 100.0, 200.0, 300.0])["logy"]  # 50 to 450: linear
    assert not line_spec([0.0, 100.0, 200.0, 900.0])["logy"]  # a zero has no log
    assert not line_spec([50.0, 200.0, 900.0, 4000.0], lows=-1.0)["logy"]  # an error bar reaching below zero
    ctx, _ = record
    for spec, axis in ((line_spec([50.0, 100.0, 200.0, 300.0]), "ymin=0"), (spanning, "ymode=log,ytick={50,")):
        tex = report.render_tex({**ctx, "figures": {**{k: [] for k in ctx["figures"]}, "concurrency": [spec]}})
        assert axis in tex
    assert report.log_ticks([0.8, 13]) == [0.5, 1, 2, 5, 10]  # the axis starts at a tick at or below the least
    # an infinite value (1/TPOT of a cell whose TPOT read 0) is a gap in the chart, not the axis's end
    assert report.log_scale([1.0, 50.0, math.inf]) and report.log_ticks([1.0, 50.0, math.inf])[-1] == 50


def test_the_records_long_latencies_are_drawn_on_log_axes_and_no_axis_starts_below_zero(record):
    ctx, _ = record
    by_id = {spec["id"]: spec for spec in every_spec(ctx)}
    assert by_id["conc-ttft-short-tp1"]["logy"]  # TTFT p99 from tens of ms to seconds
    assert not by_id["single-speedup-tp1"].get("logy")  # bars keep a linear axis from 0
    tex = report.render_tex(ctx)
    for options in re.findall(r"\\(?:begin\{axis\}|nextgroupplot)\[(.*?)\]\n", tex, flags=re.S):
        assert "ymode=log" in options or "ymin=0" in options, options
    for options in re.findall(r"\\begin\{axis\}\[(.*?)\]\n", tex, flags=re.S):
        if "Interactivity" in options:
            assert "xmode=log" in options or "xmin=0" in options, options


def test_a_caption_announces_error_bars_only_where_a_chart_draws_some(record):
    ctx, csv = record
    said = {True: 0, False: 0}
    for spec in every_spec(ctx):
        frames = [pd.read_csv(io.StringIO(csv[p["csv"].split("/")[-1]])) for p in spec.get("panels") or [spec]]
        any_bar = any((f.filter(regex="_(plus|minus)$").fillna(0) > 0).any().any() for f in frames)
        assert ("Error bars:" in spec["caption"]) == any_bar, (spec["id"], spec["caption"])
        bare = [  # a point drawn without an interval, in a chart whose points have intervals
            f[c].notna() & f[f"{c}_plus"].isna() & f[f"{c}_minus"].isna()
            for f, p in zip(frames, spec.get("panels") or [spec])
            if p.get("intervals")
            for c in f.filter(regex=r"^s\d+$")
        ]
        assert ("where an interval exists" in spec["caption"]) == (any_bar and any(b.any() for b in bare)), spec["id"]
        assert "error bars: 95" not in spec["caption"].lower() or any_bar
        said[any_bar] += 1
        if not any_bar and spec["kind"] in ("line", "bar"):
            assert "No error bars" in spec["caption"], spec["id"]
    assert said[True] and said[False]  # TTFT p99: too few values beyond the 99th percentile for an interval
    tex = report.render_tex(ctx)
    for spec in (s for s in every_spec(ctx) if s["kind"] != "grid"):
        for s in spec["series"]:  # the template draws a series' bars where it has any, and none where it has none
            drawn = re.search(rf"y={s['col']},y error plus={s['col']}_plus[^]]*\]\{{{spec['csv']}\}}", tex)
            assert bool(drawn) == s["error_bars"], (spec["id"], s["name"])


def test_pareto_points_are_joined_per_method_in_order_of_concurrency_and_labelled_with_it(record):
    ctx, csv = record
    pareto = pd.read_csv(RECORD / "summary.csv")
    for spec in (s for s in every_spec(ctx) if s["kind"] == "scatter"):
        assert spec["joined"] and spec["point_labels"]
        data = pd.read_csv(io.StringIO(csv[spec["csv"].split("/")[-1]]), dtype=str, keep_default_na=False)
        workload = spec["id"].removeprefix("pareto-")
        for s in spec["series"]:
            labels = [int(v) for v in data[f"t{s['n']}"] if v not in ("", "nan")]
            cells = pareto[(pareto["workload"] == workload) & (pareto["method"] == s["name"])]
            assert labels == sorted(cells["concurrency"]), (spec["id"], s["name"])
        assert (pd.to_numeric(data["fx"], errors="coerce").dropna() > 0).all()
    tex = report.render_tex(ctx)
    assert "nodes near coords" in tex and "meta=t0" in tex


def test_a_pareto_line_breaks_between_tp_sizes():
    frame = pd.DataFrame({"tp": [2, 1, 1, 2], "concurrency": [4, 4, 1, 1], "v": [1.0, 2.0, 3.0, 4.0]})
    path = report._path(frame, ["tp", "concurrency"])
    assert list(path["v"].fillna(0)) == [3.0, 2.0, 0, 4.0, 1.0]


def test_each_swept_algorithm_is_one_figure_of_small_multiples_and_its_legend_names_each_once(record):
    ctx, csv = record
    budget = ctx["figures"]["budget"]
    assert [spec["id"] for spec in budget] == ["sweep-ngram", "sweep-eagle3"]
    for spec in budget:
        assert spec["kind"] == "grid"
        titles = [p["title"] for p in spec["panels"]]
        assert titles == ["long, TP 1"] * 2 + ["short, TP 1"] * 2  # a row per workload: acceptance, throughput
        assert [p["ylabel"] for p in spec["panels"][:2]] == ["Acceptance length", "Tokens/s"]
        for text in spec["labels"] + [r["text"] for r in spec["reference"]]:
            words = re.findall("[a-z]+", text.lower().replace("-", " "))
            assert len(words) == len(set(words)), text  # never "DFlash dflash"
        assert [r["text"] for r in spec["reference"]] == ["DFlash"]
    ngram = budget[0]
    assert ngram["labels"] == ["ngram-d8 (tree)", "ngram-d32 (tree)"]
    joins = pd.read_csv(io.StringIO(csv[ngram["panels"][1]["csv"].split("/")[-1]]))
    assert joins["l0"].notna().sum() == 2  # one configuration at two sizes: one grey line through both
    eagle = budget[1]
    lines = pd.read_csv(io.StringIO(csv[eagle["panels"][0]["csv"].split("/")[-1]]))
    assert lines[["l0", "l1"]].notna().sum().tolist() == [1, 1]  # chain and tree differ in more than their size
    tex = report.render_tex(ctx)
    assert tex.count("\\begin{groupplot}") == 2 and "\\ref{legend-sweepngram}" in tex
    assert "\\usepgfplotslibrary{groupplots}" in tex


def test_a_legend_names_a_method_beside_its_algorithm_once():
    assert report.legend_name("dflash", "DFlash") == "DFlash"
    assert report.legend_name("dflash-b16", "DFlash") == "dflash-b16"
    assert report.legend_name("fast", "DFlash") == "DFlash fast"


def test_a_grid_of_many_rows_goes_on_as_further_figures():
    figs = report.Figures({}, ["ar"])
    frame = pd.DataFrame({"method": ["ar", "ar"], "x": [1, 2], "v": [1.0, 2.0]})
    panels = [figs.panel(f"p{i}", frame, "x", "v", None, None, "X", "V") for i in range(2 * report.GRID_ROWS + 2)]
    figs.grid("budget", "g", panels, "Cap.")
    assert [(s["id"], len(s["panels"])) for s in figs.specs] == [("g", 2 * report.GRID_ROWS), ("g-2", 2)]
    assert figs.specs[1]["caption"] == "Cap. Part 2 of 2."


def test_a_caption_says_where_only_some_points_have_an_interval(tmp_path):
    """The long workload's cells with too few sessions for an interval (as the default run's 8-session agent cells):
    its bars carry no error bar, not one of no length, and the caption says bars are drawn where an interval exists."""
    summary = pd.read_csv(RECORD / "summary.csv")
    summary.loc[summary["workload"] == "long", ["speedup_lo", "speedup_hi"]] = float("nan")
    ctx, csv = prepared(tables_of(summary, tmp_path))
    speedup = next(s for s in every_spec(ctx) if s["id"] == "single-speedup-tp1")
    assert speedup["caption"].endswith("Error bars: 95\\% paired-bootstrap CI, where an interval exists.")
    data = pd.read_csv(io.StringIO(csv["single-speedup-tp1.csv"]))
    assert speedup["xlabels"] == ["long", "short"]
    assert data.filter(regex="_plus$").iloc[0].isna().all() and (data.filter(regex="_plus$").iloc[1] > 0).all()


def test_the_workloads_table_gives_the_sessions_of_its_cells_from_the_fewest_to_the_most(record):
    """The appendix's workloads table: the record's cells measured 16 sessions at concurrency 1 and 4, 32 at 16 and
    128 at 64; the table says 16-128, never the largest alone as if every cell had run it."""
    _, csv = record
    table = pd.read_csv(io.StringIO(csv["workloads.csv"]), dtype=str)
    assert list(table["sessions"]) == ["16-128", "16-128"]


def test_the_break_even_acceptance_subsection_shows_only_where_acceptance_was_forced(tmp_path, record):
    """The forced H200 record: the subsection and its table (one row per family and concurrency, acceptance forced
    said in the text); the dummy-weight record, nothing forced: no subsection."""
    forced = REPO / "benchmarks" / "gpu" / "forced-2026-12-02"
    summary = pd.read_csv(forced / "summary.csv")
    ctx, csv = prepared(tables_of(summary, tmp_path), list(dict.fromkeys(summary["method"])))
    assert ctx["has_forced_break_even"] and ctx["forced_measured"] and not ctx["forced_simulated"]
    table = pd.read_csv(io.StringIO(csv["break_even_acceptance.csv"]))
    assert len(table) == 8 and set(table["family"]) == {"eagle3-chain", "eagle3-tree"}
    assert "%" not in csv["break_even_acceptance.csv"] and "below 2" in set(table["break_even"])
    tex = report.render_tex(ctx)
    assert "\\subsection{Break-even acceptance}" in tex and "SGLANG\\_SIMULATE\\_ACC\\_LEN" in tex
    assert "simulated backend" not in tex.split("\\subsection{Break-even acceptance}")[1].split("\\section")[0]
    ctx, _ = record
    assert not ctx["has_forced_break_even"] and "Break-even acceptance" not in report.render_tex(ctx)
