"""Where everything lives: the one place that names the workflow's files and servers.

The rules (rules/*.smk) and the package both build paths and names from here, so a layout change is made once.

    results/env/{backend}[@{engine}].json       the environment: what the server build (an engine's) is and can do
    results/cells/tp{tp}/{method}/{workload}/c{concurrency}[-r{rep}].json   one cell
    results/failed/...                          a failed cell's record, mirroring its cell path
    results/runs/tp{tp}/{method}[-r{rep}].json  a bench job's run record (its latest server run)
    results/plan/predictions.csv                the plan's predicted seconds per cell
    results/{table}.csv, .parquet               the aggregated tables
    results/report/data.json                    what both report rules read: every chart's and table's CSV text and
                                                the template's context (report_pdf writes the CSVs to data/ for LaTeX)
    results/report/report.pdf, figures/{section}/
    results/report/verdict.html                 the verdict page (stamp, verdict table, heatmap) of the HTML report
    {cache_dir}/{key[:2]}/{key}.json            the cell cache (outside the DAG: see cache.py)
    {cache_dir}/journal/tp{tp}-{method}[-r{rep}]/{run}.jsonl   a server's journal of one workflow run (runs.py)
    {cache_dir}/plan/{digest}.json              the plan's predictions for one configuration (see plan.predict)
"""

from __future__ import annotations

RESULTS = "results"
CELLS = f"{RESULTS}/cells"
FAILED = f"{RESULTS}/failed"

# the aggregated tables, each written as CSV and Parquet (see aggregate.write_tables)
TABLES = (
    "summary",
    "combined",
    "requests",
    "turns",
    "best_budget",
    "break_even",
    "break_even_acceptance",
    "pareto",
    "engines",
    "engine_builds",
    "kinds",
    "acceptance_depth",
    "slo",
    "skipped",
    "ddtree_stages",
    "width_cliff",
)

# report sections: key -> title (the PDF's sections and the HTML report's categories)
REPORT_SECTIONS = {
    "verdict": "Verdict",
    "setup": "Setup and methodology",
    "single": "Single-stream speed",
    "budget": "Draft size sweeps",
    "tp": "Tensor parallelism",
    "concurrency": "Concurrency",
    "slo": "Service-level objectives",
    "agentic": "Agentic multi-turn",
}
# figures of a subsection: key -> the section that holds it (its HTML report category)
REPORT_SUBSECTIONS = {"kinds": "single", "depth": "budget"}
REPORT_DATA = f"{RESULTS}/report/data.json"
VERDICT_HTML = f"{RESULTS}/report/verdict.html"  # the verdict page of Snakemake's HTML report
PREDICTIONS = f"{RESULTS}/plan/predictions.csv"


# Names become folder and file names (a cell's folder, a run record, a journal folder, a server's log, their
# temporary files): a file name may hold 255 bytes. The configured names (methods, engines, workloads, DDTree
# builds) are held to 64 characters by config/schema.yaml, and a method's expanded name (its sweep tags and
# @<engine> added) to MAX_EXPANDED_NAME, so that the longest files built from one (a calibration server's log,
# server-calibration-tp1024-<method>.log; a run record's temporary file, .<method>-r99.json.XXXXXXXX.tmp) stay
# well within it.
MAX_EXPANDED_NAME = 128


def _rep(repetition) -> str:
    return "" if repetition is None else f"-r{repetition}"


def server_name(tp, method: str, repetition=None) -> str:
    """A server's name in journals, plans and reports: tp{tp}/{method}[/r{rep}]."""
    return f"tp{tp}/{method}" + ("" if repetition is None else f"/r{repetition}")


def cell_path(tp, method: str, workload: str, concurrency, repetition=None) -> str:
    return f"{CELLS}/tp{tp}/{method}/{workload}/c{concurrency}{_rep(repetition)}.json"


def failure_path(cell_output: str) -> str:
    """Where a failed cell's record goes: results/failed/... mirroring its output path."""
    return cell_output.replace(f"{CELLS}/", f"{FAILED}/", 1)


def environment_path(backend: str, engine: str | None = None) -> str:
    """The environment record of the backend's build, or of one engine's (configuration ``engines``)."""
    return f"{RESULTS}/env/{backend}.json" if engine is None else f"{RESULTS}/env/{backend}@{engine}.json"


def table_path(name: str, ext: str = "csv") -> str:
    return f"{RESULTS}/{name}.{ext}"


def run_record_path(tp, method: str, repetition=None) -> str:
    return f"{RESULTS}/runs/tp{tp}/{method}{_rep(repetition)}.json"


def plan_memo_path(cache_dir: str, digest: str) -> str:
    """Where the plan keeps its predictions for the configuration (and code) with this digest."""
    return f"{cache_dir}/plan/{digest}.json"


def journal_folder(cache_dir: str, tp, method: str, repetition=None) -> str:
    """A server's journals live beside the cells it cached, outside the DAG: Snakemake removes a job's outputs
    and logs before it runs, and the journals must outlive them (the run record names the latest server run)."""
    return f"{cache_dir}/journal/tp{tp}-{method}{_rep(repetition)}"


def journal_path(cache_dir: str, tp, method: str, repetition=None, run: str = "") -> str:
    """A server's journal of one workflow run: one writer per file, so that runs sharing a cache (two results
    folders, two hosts on shared storage) never interleave or mix their events."""
    return f"{journal_folder(cache_dir, tp, method, repetition)}/{run}.jsonl"


def bench_log_path(tp, method: str, repetition=None) -> str:
    return f"logs/bench/tp{tp}-{method}{_rep(repetition)}.log"


def server_log_name(tp, method: str) -> str:
    """The server's own log, beside its bench job's log (one per server, across repetitions)."""
    return f"server-tp{tp}-{method}.log"
