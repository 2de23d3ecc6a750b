"""What the numbers mean: per-request metrics and per-cell aggregates.

Each metric is a small function whose docstring's first line is its
definition; the report prints these lines as its methodology.
Request records are dicts with the fields of client.RequestRecord.
"""

from __future__ import annotations

import math

import numpy as np

PERCENTILES = (50, 90, 95, 99)
BOOTSTRAP_RESAMPLES = 1000


# ---------------------------------------------------------------- per request

def ttft(r: dict) -> float | None:
    """TTFT = t_first - t0: from sending the request to the first chunk carrying content."""
    return r["chunk_times"][0] - r["t0"] if r["chunk_times"] else None


def e2e(r: dict) -> float | None:
    """E2E = t_last - t0: from sending the request to the last content chunk."""
    return r["chunk_times"][-1] - r["t0"] if r["chunk_times"] else None


def tpot(r: dict) -> float | None:
    """TPOT = (t_last - t_first) / (N - N_first); undefined when all N tokens came in the first chunk."""
    if not r["chunk_times"]:
        return None
    later = r["output_tokens"] - r["chunk_tokens"][0]
    if later <= 0:
        return None
    return (r["chunk_times"][-1] - r["chunk_times"][0]) / later


def interactivity(r: dict) -> float | None:
    """Interactivity = 1 / TPOT: tokens per second seen by one user."""
    value = tpot(r)
    return 1.0 / value if value else None


def itl_per_token(r: dict) -> list[float]:
    """ITL: each later chunk's gap divided by its token count, one value per token it carries."""
    out = []
    times, tokens = r["chunk_times"], r["chunk_tokens"]
    for i in range(1, len(times)):
        gap = times[i] - times[i - 1]
        out += [gap / tokens[i]] * tokens[i]
    return out


def chunk_gaps(r: dict) -> list[float]:
    """Inter-chunk gap: time between consecutive content chunks (not divided by tokens)."""
    t = r["chunk_times"]
    return [t[i] - t[i - 1] for i in range(1, len(t))]


def queue_delay(r: dict) -> float:
    """Queue delay = t0 - t_sched: how late the load generator sent the request."""
    return r["t0"] - r["t_sched"]


# ---------------------------------------------------------------- per cell

def output_throughput(records: list[dict]) -> float | None:
    """Output throughput = sum of N over successful requests / (last t_last - first t0), tokens/s."""
    ok = [r for r in records if r["error"] is None and r["chunk_times"]]
    if not ok:
        return None
    window = max(r["chunk_times"][-1] for r in ok) - min(r["t0"] for r in records)
    return sum(r["output_tokens"] for r in ok) / window if window > 0 else None


def acceptance_length(records: list[dict]) -> float | None:
    """Acceptance length = sum(N - 1) / sum(verify_ct): tokens per verify round, prefill token excluded."""
    ok = [r for r in records if r["error"] is None and r.get("verify_ct")]
    verify = sum(r["verify_ct"] for r in ok)
    return sum(r["output_tokens"] - 1 for r in ok) / verify if verify else None


def acceptance_length_per_request(records: list[dict]) -> float | None:
    """Per-request acceptance length, averaged: mean over requests of (N - 1) / verify_ct."""
    values = [(r["output_tokens"] - 1) / r["verify_ct"] for r in records if r["error"] is None and r.get("verify_ct")]
    return float(np.mean(values)) if values else None


def acceptance_length_sglang(records: list[dict]) -> float | None:
    """SGLang's acceptance length = sum(N) / sum(verify_ct): SGLang's spec_accept_length, prefill token included (shown beside ours, not used)."""
    ok = [r for r in records if r["error"] is None and r.get("verify_ct")]
    verify = sum(r["verify_ct"] for r in ok)
    return sum(r["output_tokens"] for r in ok) / verify if verify else None


def length_mismatches(records: list[dict]) -> int:
    """Length mismatches = successful requests sent with ignore_eos whose output length N differs from max_new_tokens."""
    return sum(1 for r in records if r["error"] is None and r.get("expected_tokens") is not None
               and r["output_tokens"] != r["expected_tokens"])


def tokens_per_chunk(records: list[dict]) -> float | None:
    """Tokens per chunk = sum of tokens in later chunks / number of later chunks (client-side acceptance estimate)."""
    tokens = sum(sum(r["chunk_tokens"][1:]) for r in records if r["error"] is None)
    chunks = sum(len(r["chunk_tokens"]) - 1 for r in records if r["error"] is None)
    return tokens / chunks if chunks else None


def summarise(values: list[float], seed: int = 0) -> dict:
    """Mean and percentiles of a sample, each with a 95% bootstrap confidence interval (resampling values)."""
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    out: dict = {"n": int(data.size)}
    if data.size == 0:
        return out
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.size, size=(BOOTSTRAP_RESAMPLES, data.size))
    samples = data[idx]
    stats = {"mean": (data.mean(), samples.mean(axis=1))}
    for p in PERCENTILES:
        stats[f"p{p}"] = (np.percentile(data, p), np.percentile(samples, p, axis=1))
    for name, (point, boot) in stats.items():
        lo, hi = np.percentile(boot, [2.5, 97.5])
        out[name] = float(point)
        out[f"{name}_ci"] = [float(lo), float(hi)]
    return out


def summarise_with_failures(values: list[float | None], failed: int) -> dict:
    """Percentiles with each failed request counted as +inf latency (reported beside the success-only ones)."""
    data = np.asarray([v for v in values if v is not None] + [math.inf] * failed, dtype=float)
    if data.size == 0:
        return {"n": 0}
    out = {"n": int(data.size)}
    for p in PERCENTILES:
        value = float(np.percentile(data, p, method="inverted_cdf")) if failed else float(np.percentile(data, p))
        out[f"p{p}"] = value if math.isfinite(value) else None  # None: the percentile falls among failures
    return out


def session_completion(records: list[dict]) -> list[float]:
    """Session completion time = last content chunk of its last turn - send time of its first turn (all turns successful)."""
    sessions: dict = {}
    for r in records:
        sessions.setdefault(r["session"], []).append(r)
    out = []
    for turns in sessions.values():
        if all(t["error"] is None and t["chunk_times"] for t in turns):
            out.append(max(t["chunk_times"][-1] for t in turns) - min(t["t0"] for t in turns))
    return out


def per_turn(records: list[dict], seed: int = 0) -> dict:
    """Per turn index: requests, TTFT and E2E percentiles, mean prompt and cached tokens (prefix-cache hits)."""
    out = {}
    for turn in sorted({r["turn"] for r in records}):
        rows = [r for r in records if r["turn"] == turn]
        ok = [r for r in rows if r["error"] is None]
        out[str(turn)] = {
            "requests": len(rows), "failed": len(rows) - len(ok),
            "ttft": summarise([ttft(r) for r in ok], seed), "e2e": summarise([e2e(r) for r in ok], seed),
            "prompt_tokens_mean": float(np.mean([r["prompt_tokens"] for r in ok])) if ok else None,
            "cached_tokens_mean": float(np.mean([r["cached_tokens"] for r in ok])) if ok else None,
        }
    return out


def acceptance_agreement(estimates: dict, tolerance: float = 0.02) -> dict:
    """Agreement of acceptance estimates: max relative difference to the request-level value; disagree above tolerance (2%)."""
    reference = estimates.get("acceptance_length")
    others = {k: v for k, v in estimates.items() if k != "acceptance_length" and v is not None}
    if reference is None or not others:
        return {"max_relative_difference": None, "disagree": False}
    diff = max(abs(v - reference) / reference for v in others.values())
    return {"max_relative_difference": diff, "disagree": bool(diff > tolerance)}


def throughput_ci(records: list[dict], seed: int = 0) -> list[float] | None:
    """95% CI of output throughput: bootstrap over requests of sum(N*)/sum(E2E*) x (sum(E2E)/window)."""
    ok = [r for r in records if r["error"] is None and r["chunk_times"]]
    point = output_throughput(records)
    if not ok or point is None:
        return None
    n = np.array([r["output_tokens"] for r in ok], dtype=float)
    d = np.array([e2e(r) for r in ok], dtype=float)
    if d.sum() <= 0:
        return None
    occupancy = point * d.sum() / n.sum()  # = sum(E2E) / window
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ok), size=(BOOTSTRAP_RESAMPLES, len(ok)))
    boot = n[idx].sum(axis=1) / d[idx].sum(axis=1) * occupancy
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return [float(lo), float(hi)]


def failures(records: list[dict]) -> dict:
    """Failed requests by category (connect, http_status, timeout, truncated, server_died, server_error, aborted, client_error)."""
    out: dict = {}
    for r in records:
        if r["error"]:
            out[r["error"]] = out.get(r["error"], 0) + 1
    return out


def cell_metrics(records: list[dict], tp: int, seed: int = 0) -> dict:
    """All per-cell aggregates of METRICS.md from the measured (non-warm-up) request records."""
    ok = [r for r in records if r["error"] is None]
    throughput = output_throughput(records)
    itl = [v for r in ok for v in itl_per_token(r)]
    return {
        "requests_sent": len(records),
        "requests_completed": len(ok),
        "requests_failed": len(records) - len(ok),
        "failures": failures(records),
        "length_mismatches": length_mismatches(records),
        "output_tokens": int(sum(r["output_tokens"] for r in ok)),
        "output_throughput": throughput,
        "output_throughput_ci": throughput_ci(records, seed),
        "output_throughput_per_gpu": throughput / tp if throughput is not None else None,
        "ttft": summarise([ttft(r) for r in ok], seed),
        "tpot": summarise([tpot(r) for r in ok], seed),
        "itl": summarise(itl, seed),
        "e2e": summarise([e2e(r) for r in ok], seed),
        "interactivity": summarise([interactivity(r) for r in ok], seed),
        "queue_delay": summarise([queue_delay(r) for r in records], seed),
        "chunk_gap": summarise([g for r in ok for g in chunk_gaps(r)], seed),
        "ttft_with_failures": summarise_with_failures([ttft(r) for r in ok], len(records) - len(ok)),
        "e2e_with_failures": summarise_with_failures([e2e(r) for r in ok], len(records) - len(ok)),
        "session_completion": summarise(session_completion(records), seed),
        "per_turn": per_turn(records, seed) if any(r["turn"] for r in records) else {},
        "acceptance_length": acceptance_length(records),
        "acceptance_length_per_request": acceptance_length_per_request(records),
        "acceptance_length_sglang": acceptance_length_sglang(records),
        "tokens_per_chunk": tokens_per_chunk(records),
    }


def definitions() -> list[tuple[str, str]]:
    """(name, definition) for every metric, from the first line of each docstring."""
    funcs = [ttft, e2e, tpot, interactivity, itl_per_token, chunk_gaps, queue_delay,
             output_throughput, throughput_ci, acceptance_length, acceptance_length_per_request,
             acceptance_length_sglang, tokens_per_chunk, length_mismatches,
             acceptance_agreement, summarise, summarise_with_failures, session_completion, per_turn, failures,
             speedup, first_divergence, losslessness]
    return [(f.__name__, f.__doc__.strip().splitlines()[0]) for f in funcs]


def _throughput_estimator(records: list[dict]) -> tuple[dict, float] | None:
    """Per-session (tokens, busy seconds) of successful requests and the cell's occupancy."""
    point = output_throughput(records)
    ok = [r for r in records if r["error"] is None and r["chunk_times"]]
    if point is None or not ok:
        return None
    per_session: dict = {}
    for r in ok:
        n, d = per_session.get(r["session"], (0.0, 0.0))
        per_session[r["session"]] = (n + r["output_tokens"], d + e2e(r))
    total_n = sum(v[0] for v in per_session.values())
    total_d = sum(v[1] for v in per_session.values())
    return per_session, point * total_d / total_n


def speedup(method_records: list[dict], ar_records: list[dict], seed: int = 0) -> dict:
    """Speedup = output throughput of the method / that of AR on the same prompts; 95% CI by paired bootstrap over sessions."""
    a, b = output_throughput(method_records), output_throughput(ar_records)
    if not a or not b:
        return {"speedup": None, "speedup_ci": None}
    ea, eb = _throughput_estimator(method_records), _throughput_estimator(ar_records)
    common = sorted(set(ea[0]) & set(eb[0]))
    out = {"speedup": a / b, "speedup_ci": None}
    if len(common) < 2:
        return out
    na = np.array([ea[0][s][0] for s in common]); da = np.array([ea[0][s][1] for s in common])
    nb = np.array([eb[0][s][0] for s in common]); db = np.array([eb[0][s][1] for s in common])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(common), size=(BOOTSTRAP_RESAMPLES, len(common)))
    ratio = (na[idx].sum(1) / da[idx].sum(1) * ea[1]) / (nb[idx].sum(1) / db[idx].sum(1) * eb[1])
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    out["speedup_ci"] = [float(lo), float(hi)]
    return out


def first_divergence(tokens: list[str], reference: list[str]) -> int | None:
    """First divergence = index of the first token where an output differs from the reference output (None if equal)."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def losslessness(method_records: list[dict], ar_records: list[dict]) -> dict:
    """Losslessness = share of requests whose output equals AR's for the same prompt (greedy), and first divergence positions."""
    from .text import split_tokens

    reference = {(r["session"], r["turn"]): r for r in ar_records if r["error"] is None}
    positions, compared, equal = [], 0, 0
    for r in method_records:
        ref = reference.get((r["session"], r["turn"]))
        if r["error"] is not None or ref is None:
            continue
        compared += 1
        position = first_divergence(split_tokens(r["output_text"]), split_tokens(ref["output_text"]))
        if position is None:
            equal += 1
        else:
            positions.append(position)
    return {
        "compared": compared,
        "exact_match_rate": equal / compared if compared else None,
        "diverged": len(positions),
        "first_divergence_median": float(np.median(positions)) if positions else None,
        "first_divergence_min": int(min(positions)) if positions else None,
    }


def relative_precision(records: list[dict], metric: str = "output_throughput", seed: int = 0) -> float | None:
    """Relative precision = half-width of the metric's 95% CI / its value (metric: output_throughput or name.stat)."""
    if metric == "output_throughput":
        point, ci = output_throughput(records), throughput_ci(records, seed)
    else:
        name, stat = metric.split(".")
        ok = [r for r in records if r["error"] is None]
        per_request = {"ttft": ttft, "tpot": tpot, "e2e": e2e, "interactivity": interactivity}
        values = [v for r in ok for v in itl_per_token(r)] if name == "itl" else [per_request[name](r) for r in ok]
        summary = summarise(values, seed)
        point, ci = summary.get(stat), summary.get(f"{stat}_ci")
    if not point or not ci:
        return None
    return (ci[1] - ci[0]) / 2 / abs(point)
