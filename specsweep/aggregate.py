"""Aggregation: cell JSON files into one tidy table (one row per cell), speedups over AR."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .metrics import losslessness, speedup

SUMMARY_COLUMNS = [
    "simulated", "tp", "method", "algorithm", "block_size", "budget", "topk", "workload", "family",
    "concurrency", "repetition", "requests_sent", "requests_completed", "requests_failed", "output_tokens",
    "output_throughput", "output_throughput_lo", "output_throughput_hi", "output_throughput_per_gpu",
    "speedup", "speedup_lo", "speedup_hi",
    "ttft_p50", "ttft_p99", "tpot_mean", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99",
    "acceptance_length", "acceptance_length_server", "tokens_per_chunk", "acceptance_disagree",
    "ttft_p99_with_failures", "e2e_p99_with_failures", "session_completion_p50",
    "lossless_compared", "lossless_exact_rate", "lossless_first_divergence_median", "lossless_first_divergence_min",
    "cell_file",
]


def _get(metrics: dict, name: str, stat: str):
    return metrics.get(name, {}).get(stat)


def cell_row(cell: dict, path: str) -> dict:
    m, c, method = cell["metrics"], cell["cell"], cell["method"]
    ci = m.get("output_throughput_ci") or [None, None]
    return {
        "simulated": cell["simulated"], "tp": c["tp"], "method": c["method"], "algorithm": method["algorithm"],
        "block_size": method["params"].get("block_size"), "budget": method["params"].get("budget"),
        "topk": method["params"].get("topk"), "workload": c["workload"], "family": cell["workload"]["family"],
        "concurrency": c["concurrency"], "repetition": c["repetition"],
        "requests_sent": m["requests_sent"], "requests_completed": m["requests_completed"],
        "requests_failed": m["requests_failed"], "output_tokens": m["output_tokens"],
        "output_throughput": m["output_throughput"], "output_throughput_lo": ci[0], "output_throughput_hi": ci[1],
        "output_throughput_per_gpu": m.get("output_throughput_per_gpu"),
        "ttft_p50": _get(m, "ttft", "p50"), "ttft_p99": _get(m, "ttft", "p99"),
        "tpot_mean": _get(m, "tpot", "mean"), "tpot_p50": _get(m, "tpot", "p50"), "tpot_p99": _get(m, "tpot", "p99"),
        "itl_p50": _get(m, "itl", "p50"), "itl_p99": _get(m, "itl", "p99"),
        "e2e_p50": _get(m, "e2e", "p50"), "e2e_p99": _get(m, "e2e", "p99"),
        "acceptance_length": m.get("acceptance_length"),
        "acceptance_length_server": m.get("acceptance_length_server"),
        "tokens_per_chunk": m.get("tokens_per_chunk"),
        "acceptance_disagree": (m.get("acceptance_agreement") or {}).get("disagree"),
        "ttft_p99_with_failures": (m.get("ttft_with_failures") or {}).get("p99"),
        "e2e_p99_with_failures": (m.get("e2e_with_failures") or {}).get("p99"),
        "session_completion_p50": _get(m, "session_completion", "p50"),
        "cell_file": path,
    }


def summarise_cells(paths: list[str]) -> pd.DataFrame:
    """One row per cell, with speedup over AR at the same (tp, workload, concurrency, repetition)."""
    cells = {p: json.loads(Path(p).read_text()) for p in paths}
    rows = [cell_row(c, p) for p, c in cells.items()]
    ar = {(c["cell"]["tp"], c["cell"]["workload"], c["cell"]["concurrency"], c["cell"]["repetition"]): c
          for c in cells.values() if c["method"]["algorithm"] == "ar"}
    for row, cell in zip(rows, cells.values()):
        base = ar.get((row["tp"], row["workload"], row["concurrency"], row["repetition"]))
        s = speedup(cell["requests"], base["requests"]) if base else {"speedup": None, "speedup_ci": None}
        ci = s["speedup_ci"] or [None, None]
        row.update(speedup=s["speedup"], speedup_lo=ci[0], speedup_hi=ci[1])
        if base is not None and cell["method"]["algorithm"] != "ar" and cell["sampling"]["temperature"] == 0:
            lossless = losslessness(cell["requests"], base["requests"])
            row.update(lossless_compared=lossless["compared"], lossless_exact_rate=lossless["exact_match_rate"],
                       lossless_first_divergence_median=lossless["first_divergence_median"],
                       lossless_first_divergence_min=lossless["first_divergence_min"])
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return frame.sort_values(["tp", "workload", "concurrency", "method", "repetition"]).reset_index(drop=True)
