"""The report: CSV data per chart, the LaTeX document (pgfplots), its PDF, and matplotlib figures.

Every number shown comes from results/summary.csv through the CSV files
written here; the .tex only names columns.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from datetime import date
from pathlib import Path

import jinja2
import pandas as pd

from .metrics import BOOTSTRAP_RESAMPLES, definitions

TEX_MISSING = (
    "latexmk or pdflatex was not found. Install TeX Live: "
    "sudo apt-get install texlive-latex-base texlive-latex-recommended texlive-pictures "
    "texlive-science lmodern latexmk (or run the README's set-up command)."
)
COLORS = ["blue", "red", "green!60!black", "orange", "violet", "cyan", "brown", "magenta", "gray", "teal"]


class ReportError(RuntimeError):
    pass


def tex_escape(text) -> str:
    table = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
             "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
    return "".join(table.get(ch, ch) for ch in str(text))


def _series_columns(frame: pd.DataFrame, methods: list[str], index: str, value: str, lo: str, hi: str) -> pd.DataFrame:
    """Wide table: one row per ``index`` value; per method i: m<i>, m<i>_plus, m<i>_minus (error bar lengths)."""
    out = pd.DataFrame({index: sorted(frame[index].unique())})
    for i, method in enumerate(methods):
        sub = frame[frame["method"] == method].groupby(index)[[value, lo, hi]].mean()
        out[f"m{i}"] = out[index].map(sub[value])
        out[f"m{i}_plus"] = out[index].map(sub[hi] - sub[value]).clip(lower=0)
        out[f"m{i}_minus"] = out[index].map(sub[value] - sub[lo]).clip(lower=0)
    return out


def write_report_data(summary: pd.DataFrame, environment: dict, config_view: dict, data_dir: Path) -> dict:
    """Write the CSV files the LaTeX report reads; return the template context."""
    data_dir.mkdir(parents=True, exist_ok=True)
    methods = list(dict.fromkeys(config_view["methods"]))
    simulated = bool(summary["simulated"].any()) if len(summary) else environment.get("simulated", False)
    ctx: dict = {
        "simulated": simulated, "methods": methods,
        "title": tex_escape(config_view["title"]), "author": tex_escape(config_view["author"]),
        "date": date.today().isoformat(), "model": tex_escape(config_view["model"]),
        "backend": tex_escape(environment["backend"]),
        "sim_profile": tex_escape(config_view.get("sim_profile", "")),
        "n_servers": summary[["tp", "method"]].drop_duplicates().shape[0], "n_cells": len(summary),
        "tps": ", ".join(str(t) for t in sorted(summary["tp"].unique())),
        "method_list": ", ".join(tex_escape(m) for m in methods),
        "workload_list": ", ".join(tex_escape(w) for w in summary["workload"].unique()),
        "concurrency_list": ", ".join(str(c) for c in sorted(summary["concurrency"].unique())),
        "warmup": config_view["warmup"], "resamples": BOOTSTRAP_RESAMPLES,
        "definitions": [(tex_escape(n), tex_escape(d)) for n, d in definitions()],
    }
    prov = [("Backend", environment["backend"] + (" (simulated)" if simulated else "")),
            ("Server", f"{environment['server']['name']} {environment['server'].get('version')}"),
            ("Python", environment["software"]["python"]),
            ("specsweep", environment["software"]["specsweep"]),
            ("Snakemake", environment["software"].get("snakemake")),
            ("GPUs", ", ".join(g["name"] for g in environment["hardware"]["gpus"]) or "none"),
            ("Model", config_view["model"])]
    if simulated:
        prov.append(("Simulated profile", config_view.get("sim_profile", "")))
    pd.DataFrame([{"item": tex_escape(k), "value": tex_escape(v)} for k, v in prov]).to_csv(
        data_dir / "provenance.csv", index=False)

    figures = []
    for tp in sorted(summary["tp"].unique()):
        for workload in summary["workload"].unique():
            sub = summary[(summary["tp"] == tp) & (summary["workload"] == workload)]
            if sub.empty:
                continue
            present = [m for m in methods if m in set(sub["method"])]
            wide = _series_columns(sub, present, "concurrency", "output_throughput",
                                   "output_throughput_lo", "output_throughput_hi")
            name = f"throughput-{workload}-tp{tp}.csv"
            wide.to_csv(data_dir / name, index=False, na_rep="nan")
            figures.append({"csv": f"data/{name}", "workload": tex_escape(workload), "tp": int(tp),
                            "xticks": ",".join(str(c) for c in wide["concurrency"]),
                            "requests": int(sub["requests_sent"].max()),
                            "series": [{"col": f"m{i}", "label": tex_escape(m)} for i, m in enumerate(present)]})
    ctx["throughput_figures"] = figures

    speedups = []
    lowest = int(summary["concurrency"].min()) if len(summary) else 1
    ctx["lowest_concurrency"] = lowest
    has_ar = summary["speedup"].notna().any()
    if has_ar:
        for tp in sorted(summary["tp"].unique()):
            sub = summary[(summary["tp"] == tp) & (summary["concurrency"] == lowest) & summary["speedup"].notna()
                          & (summary["algorithm"] != "ar")]
            if sub.empty:
                continue
            workloads = list(sub["workload"].unique())
            sub = sub.assign(x=sub["workload"].map({w: i for i, w in enumerate(workloads)}))
            present = [m for m in methods if m in set(sub["method"])]
            wide = _series_columns(sub, present, "x", "speedup", "speedup_lo", "speedup_hi")
            name = f"speedup-tp{tp}-c{lowest}.csv"
            wide.to_csv(data_dir / name, index=False, na_rep="nan")
            n = len(present)
            speedups.append({"csv": f"data/{name}", "tp": int(tp), "concurrency": lowest,
                             "xticks": ",".join(str(i) for i in range(len(workloads))),
                             "xlabels": ",".join(tex_escape(w) for w in workloads),
                             "bar_width": max(4, min(14, int(300 / max(1, n * len(workloads))))),
                             "enlarge": 0.5 if len(workloads) == 1 else 0.25,
                             "series": [{"col": f"m{i}", "label": tex_escape(m), "color": COLORS[i % len(COLORS)]}
                                        for i, m in enumerate(present)]})
    ctx["speedup_figures"] = speedups

    spec = summary[summary["algorithm"] != "ar"]
    ctx["has_speculative"] = not spec.empty
    acc = spec[spec["concurrency"] == lowest][["tp", "method", "workload", "acceptance_length",
                                              "acceptance_length_server", "tokens_per_chunk"]]
    acc = acc.assign(method=acc["method"].map(tex_escape), workload=acc["workload"].map(tex_escape))
    acc.to_csv(data_dir / "acceptance.csv", index=False)

    cells = summary.assign(
        method=summary["method"].map(tex_escape), workload=summary["workload"].map(tex_escape),
        ttft_p50_ms=summary["ttft_p50"] * 1000, tpot_p50_ms=summary["tpot_p50"] * 1000,
        itl_p99_ms=summary["itl_p99"] * 1000)
    cells[["tp", "method", "workload", "concurrency", "requests_completed", "requests_failed", "output_throughput",
           "speedup", "ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms"]].to_csv(data_dir / "cells.csv", index=False)
    return ctx


def render_tex(ctx: dict) -> str:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("specsweep", "templates"),
        block_start_string=r"\BLOCK{", block_end_string="}",
        variable_start_string=r"\VAR{", variable_end_string="}",
        comment_start_string=r"\#{", comment_end_string="}",
        trim_blocks=True, lstrip_blocks=True, autoescape=False, undefined=jinja2.StrictUndefined)
    return env.get_template("report.tex.j2").render(**ctx)


def compile_pdf(tex_path: Path, log_path: Path | None = None) -> Path:
    """Compile with latexmk (pdflatex); raise ReportError with the log's tail on failure."""
    if not shutil.which("latexmk") or not shutil.which("pdflatex"):
        raise ReportError(TEX_MISSING)
    proc = subprocess.run(["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error",
                           tex_path.name], cwd=tex_path.parent, capture_output=True, text=True, timeout=600)
    if log_path:
        log_path.write_text(proc.stdout + proc.stderr)
    pdf = tex_path.with_suffix(".pdf")
    if proc.returncode != 0 or not pdf.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise ReportError(f"latexmk failed on {tex_path}:\n{tail}")
    return pdf


def build_report(summary_csv: str, environment_json: str, config_view: dict, out_pdf: str, log_path: str | None = None) -> None:
    """summary.csv + environment -> data CSVs, report.tex and report.pdf in the folder of out_pdf."""
    summary = pd.read_csv(summary_csv)
    environment = json.loads(Path(environment_json).read_text())
    out = Path(out_pdf)
    ctx = write_report_data(summary, environment, config_view, out.parent / "data")
    tex = out.with_suffix(".tex")
    tex.write_text(render_tex(ctx))
    pdf = compile_pdf(tex, Path(log_path) if log_path else None)
    if pdf != out:
        shutil.move(pdf, out)


def plot_throughput(summary_csv: str, out_png: str, simulated_note: bool = True) -> None:
    """Matplotlib version of the throughput charts (for Snakemake's HTML report)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = pd.read_csv(summary_csv)
    panels = summary[["tp", "workload"]].drop_duplicates().values.tolist()
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, (tp, workload) in zip(axes.flat, panels):
        sub = summary[(summary["tp"] == tp) & (summary["workload"] == workload)]
        for method, m in sub.groupby("method", sort=False):
            m = m.sort_values("concurrency")
            err = [(m["output_throughput"] - m["output_throughput_lo"]).clip(lower=0),
                   (m["output_throughput_hi"] - m["output_throughput"]).clip(lower=0)]
            ax.errorbar(m["concurrency"], m["output_throughput"], yerr=err, marker="o", capsize=3, label=method)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{workload}, TP {tp}")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), frameon=False)
    if simulated_note and summary["simulated"].any():
        fig.suptitle("SIMULATED BACKEND: not measured on GPUs", color="darkred")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
