"""What the numbers mean: per-request metrics and per-cell aggregates.

Each metric is a small function whose docstring's first paragraph is its
definition; the report prints these paragraphs as its methodology.
Request records are dicts with the fields of client.RequestRecord.
"""

from __future__ import annotations

import math

import numpy as np

from .text import split_tokens

PERCENTILES = (50, 90, 95, 99)
BOOTSTRAP_RESAMPLES = 1000
MIN_SESSIONS = 10  # independent units (sessions) below which no interval is claimed
TAIL_VALUES = 5  # values needed beyond a percentile (n x min(p, 1 - p)) for its interval
# Student t quantiles t(0.975, df) for df = 1..30 (df above 30: the last one, 2.04, is within 2% of 1.96)
T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


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


# ---------------------------------------------------------------- load actually held


def end_time(r: dict) -> float:
    """t_end: when a request finished (its last chunk, [DONE] or its failure); older records: last chunk or t0."""
    if r.get("t_end") is not None:
        return r["t_end"]
    return r["chunk_times"][-1] if r["chunk_times"] else r["t0"]


def in_flight(records: list[dict]) -> list[tuple[float, float, int]]:
    """Requests in flight over time: (from, to, count) pieces, a request counting from t0 until t_end."""
    events = sorted(
        [(r["t0"], 1) for r in records] + [(end_time(r), -1) for r in records], key=lambda e: (e[0], e[1])
    )  # at one instant an end comes before a send
    pieces, count = [], 0
    for (t, step), (t_next, _) in zip(events, events[1:]):  # after the last event nothing is in flight
        count += step
        if t_next > t:
            pieces.append((t, t_next, count))
    return pieces


def steady_window(
    records: list[dict], concurrency: int, load_model: str = "closed", pieces: list | None = None
) -> list[float] | None:
    """Steady-state window = from the first to the last moment the cell's concurrency was in flight (closed loop;
    open loop: from the first to the last send); None when the concurrency was never reached.

    ``pieces``: in_flight(records), where the caller has them already."""
    if not records:
        return None
    if load_model != "closed":
        sends = [r["t0"] for r in records]
        return [min(sends), max(sends)] if max(sends) > min(sends) else None
    held = [(a, b) for a, b, n in (pieces if pieces is not None else in_flight(records)) if n >= concurrency]
    return [held[0][0], held[-1][1]] if held else None


def achieved_concurrency(records: list[dict], window: list[float] | None = None, pieces: list | None = None) -> dict:
    """Achieved concurrency = time-weighted mean and peak of requests in flight (t0 <= t < t_end), over the
    measurement (first send to last end) or over a window.

    ``pieces``: in_flight(records), where the caller has them already."""
    pieces = pieces if pieces is not None else in_flight(records)
    if window is not None:
        pieces = [(max(a, window[0]), min(b, window[1]), n) for a, b, n in pieces if b > window[0] and a < window[1]]
    span = sum(b - a for a, b, _ in pieces)
    if not pieces or span <= 0:
        return {"mean": None, "peak": None}
    return {"mean": sum((b - a) * n for a, b, n in pieces) / span, "peak": max(n for _, _, n in pieces)}


def concurrency_report(records: list[dict], concurrency: int, load_model: str = "closed") -> dict:
    """The cell's label beside what it held: mean and peak in flight over the measurement and over the
    steady-state window, the window ([from, to], seconds since the first send) and its share of the measurement."""
    pieces = in_flight(records)
    window = steady_window(records, concurrency, load_model, pieces)
    whole = achieved_concurrency(records, None, pieces)
    steady = achieved_concurrency(records, window, pieces) if window else {"mean": None, "peak": None}
    span = (max(end_time(r) for r in records) - min(r["t0"] for r in records)) if records else 0.0
    return {
        "label": concurrency,
        "load_model": load_model,
        "mean": whole["mean"],
        "peak": whole["peak"],
        "steady_mean": steady["mean"],
        "window": window,
        "window_share": (window[1] - window[0]) / span if window and span > 0 else None,
        "held": window is not None,
    }


# ---------------------------------------------------------------- per cell


def engine_steps(records: list[dict], window: list[float]) -> list[dict]:
    """Engine steps seen by the client inside a window: chunk arrivals grouped by instant (within a quarter of the
    median gap between a request's chunks), each with its duration since the previous step, the requests it served
    and those it brought a first token (their prefill)."""
    arrivals = sorted(
        (t, i, k == 0)
        for i, r in enumerate(records)
        for k, t in enumerate(r["chunk_times"])
        if window[0] < t <= window[1]
    )
    gaps = [g for r in records for g in chunk_gaps(r)]
    tolerance = 0.25 * float(np.median(gaps)) if gaps else 0.0
    steps: list[dict] = []
    for t, i, first in arrivals:
        if not steps or t - steps[-1]["last"] > tolerance:
            steps.append({"time": t, "last": t, "served": [], "first": []})
        step = steps[-1]
        step["last"] = t
        step["served"].append(i)
        if first:
            step["first"].append(i)
    previous = window[0]
    for step in steps:
        step["seconds"], previous = step["last"] - previous, step["last"]
    return steps


def measurement_window(records: list[dict]) -> list[float] | None:
    """The whole measurement: from the first send to the last content chunk of a successful request."""
    ends = [r["chunk_times"][-1] for r in records if r["error"] is None and r["chunk_times"]]
    return [min(r["t0"] for r in records), max(ends)] if ends else None


def _tokens_in(r: dict, a: float, b: float) -> int:
    """Output tokens of a successful request whose chunks arrived in (a, b]."""
    return sum(n for t, n in zip(r["chunk_times"], r["chunk_tokens"]) if a < t <= b) if r["error"] is None else 0


def _session_shares(records: list[dict], window: list[float], counted=None) -> dict:
    """Per session: (output tokens of its successful requests that arrived inside the window, engine seconds
    charged to it there, its content kind); ``counted``: where given, only the tokens of the requests it accepts
    count (the seconds are all of them).

    Charging: a step's time is shared by the requests it served, except the excess over the median plain step of
    a step that brought first tokens (prefill), charged to the requests it admitted: a request that joins the
    batch stalls everyone, and that stall is its own cost.
    """
    a, b = window
    steps = engine_steps(records, window)
    plain = [s["seconds"] for s in steps if not s["first"]]
    typical = float(np.median(plain)) if plain else 0.0
    charged = [0.0] * len(records)
    for step in steps:
        stall = max(0.0, step["seconds"] - typical) if step["first"] else 0.0
        for i in step["served"]:
            charged[i] += (step["seconds"] - stall) / len(step["served"])
        for i in step["first"]:
            charged[i] += stall / len(step["first"])
    out: dict = {}
    for r, seconds in zip(records, charged):
        n, d, _ = out.get(r["session"], (0, 0.0, None))
        tokens = _tokens_in(r, a, b) if counted is None or counted(r) else 0
        out[r["session"]] = (n + tokens, d + seconds, r["kind"])
    return out


def output_throughput(records: list[dict], window: list[float] | None = None) -> float | None:
    """Output throughput = output tokens of successful requests arriving inside the steady-state window / its
    length (tokens/s); without a window, sum of N over successful requests / (last t_last - first t0)."""
    window = window or measurement_window(records)
    if window is None or window[1] <= window[0] or not any(r["error"] is None and r["chunk_times"] for r in records):
        return None
    return sum(_tokens_in(r, *window) for r in records) / (window[1] - window[0])


def _shares_and_scale(records: list[dict], window: list[float] | None, counted=None) -> tuple[dict, float] | None:
    """The parts of the throughput estimator: per-session shares inside the window (the measurement without one)
    and the engine seconds charged in all per second of window (about 1); None when no tokens arrived in it.
    ``counted``: see _session_shares.

    Throughput = sum(tokens) / sum(seconds) x scale, for every set of sessions the bootstrap draws."""
    window = window or measurement_window(records)
    if window is None or window[1] <= window[0]:
        return None
    shares = _session_shares(records, window, counted)
    if not sum(v[0] for v in shares.values()):
        return None
    return shares, sum(v[1] for v in shares.values()) / (window[1] - window[0])


def _resample(strata: list, seed: int) -> np.ndarray:
    """The weight of each independent unit in each bootstrap resample (resamples x units), resampling within each
    unit's stratum (its content kind: a workload's mix of kinds is fixed, not drawn). A stratum of n units draws
    n - 1 of them and weighs each draw n / (n - 1) (the rescaling bootstrap), since drawing all n understates the
    variance of a small stratum by the factor (n - 1) / n."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((BOOTSTRAP_RESAMPLES, len(strata)))
    for label in dict.fromkeys(strata):
        columns = [i for i, s in enumerate(strata) if s == label]
        draws = max(1, len(columns) - 1)
        counts[:, columns] = rng.multinomial(draws, [1.0 / len(columns)] * len(columns), size=BOOTSTRAP_RESAMPLES) * (
            len(columns) / draws
        )
    return counts


def _interval(boot: np.ndarray) -> list[float] | None:
    lo, hi = np.percentile(boot[np.isfinite(boot)], [2.5, 97.5])
    # a zero-width interval (up to rounding of the weights) is no interval
    return [float(lo), float(hi)] if hi - lo > 1e-9 * max(abs(lo), abs(hi)) else None


def throughput_ci(
    records: list[dict], window: list[float] | None = None, seed: int = 0, kind: str | None = None
) -> list[float] | None:
    """95% CI of output throughput: bootstrap over sessions of sum(tokens*)/sum(seconds*) x sum(seconds)/window,
    with each session's tokens and the engine seconds charged to it inside the steady-state window (a session's
    prefill stalls the whole batch and is charged to it); none below MIN_SESSIONS sessions.

    With ``kind``: of that content kind's throughput (kind_throughput), over its sessions alone."""
    return _charged_ratio_ci(records, window, seed, kind=kind)


def _charged_ratio_ci(
    records: list[dict], window: list[float] | None, seed: int, counted=None, kind: str | None = None
) -> list[float] | None:
    """throughput_ci's bootstrap, counting the tokens of the requests ``counted`` accepts (all without it), over the
    sessions of content kind ``kind`` (all without it)."""
    parts = _shares_and_scale(records, window, counted) if records else None
    if parts is None:
        return None
    shares = [v for v in parts[0].values() if v[1] > 0 and (kind is None or v[2] == kind)]
    if len(shares) < MIN_SESSIONS:
        return None
    n = np.array([v[0] for v in shares], dtype=float)
    d = np.array([v[1] for v in shares], dtype=float)
    scale = parts[1]
    w = _resample([v[2] for v in shares], seed)
    return _interval(w @ n / (w @ d) * scale)


def kind_throughput(records: list[dict], kind: str, window: list[float] | None = None) -> float | None:
    """Output throughput of a content kind = tokens its sessions received inside the steady-state window / engine
    seconds charged to them there x the window's charged seconds per second (about 1): the rate at which the engine
    delivered that kind's tokens while serving it; the kinds' rates weighted by their charged seconds give the
    cell's throughput. None where its sessions received no tokens in the window.

    The seconds are charged as throughput_ci charges them, over every request of the cell: a step that served
    several kinds is shared among them. Records filtered by kind before charging would charge the steps that served
    the other kinds to this one (at concurrency 1, each other request's whole time)."""
    parts = _shares_and_scale(records, window) if records else None
    if parts is None:
        return None
    shares = [v for v in parts[0].values() if v[2] == kind]
    tokens, seconds = sum(v[0] for v in shares), sum(v[1] for v in shares)
    return tokens / seconds * parts[1] if tokens > 0 and seconds > 0 else None


def of_kind(records: list[dict], kind: str) -> list[dict]:
    """The records of one content kind's sessions (for per-request measures: acceptance, latencies; never for
    throughput or speedup, which charge engine time over every request: kind_throughput, speedup)."""
    return [r for r in records if r["kind"] == kind]


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
    """SGLang's acceptance length = sum(N) / sum(verify_ct): SGLang's spec_accept_length, prefill token included
    (shown beside ours, not used)."""
    ok = [r for r in records if r["error"] is None and r.get("verify_ct")]
    verify = sum(r["verify_ct"] for r in ok)
    return sum(r["output_tokens"] for r in ok) / verify if verify else None


def drafts_accepted(records: list[dict]) -> list[int] | None:
    """Verify rounds by drafts accepted, summed over the successful requests whose server reported them (SGLang's
    spec_correct_drafts_histogram, spec_accept_histogram before 0.5.21: h[k] = rounds that accepted exactly k
    drafts, the target's own token not counted); None where no request carries one (not reported by the build)."""
    total: list[int] = []
    for r in records:
        histogram = r.get("correct_drafts_histogram") if r["error"] is None else None
        for k, rounds in enumerate(histogram or ()):
            total.extend([0] * (k + 1 - len(total)))
            total[k] += rounds
    return total if sum(total) else None


def acceptance_by_depth(records: list[dict], depth: int | None = None) -> list[float] | None:
    """Acceptance rate at draft depth d (d = 1 .. D) = verify rounds that accepted at least d drafts / all verify
    rounds = sum(h[k], k >= d) / sum(h), with h the rounds by drafts accepted (drafts_accepted); D = ``depth`` (the
    method's draft_depth, the most drafts a round can accept: deeper than the deepest accepted, the rate is 0) or
    the deepest accepted; None where no request carries the histogram (not reported by the build).

    Unconditional, as vLLM exports per-position acceptance (vllm:spec_decode_num_accepted_tokens_per_pos /
    vllm:spec_decode_num_drafts, vllm/v1/spec_decode/metrics.py): a draft at depth d counts only if every draft
    before it was accepted, so the rates fall with d and their sum is the mean drafts accepted a round (acceptance
    length less the target's own token); conditional_acceptance gives the drafter's accuracy at each depth it
    reached. A round that drafted fewer than d tokens (a short n-gram match) counts as not accepting at d: the
    histogram does not say how deep a round drafted."""
    total = drafts_accepted(records)
    if total is None:
        return None
    rounds = sum(total)
    deepest = max(len(total) - 1, depth or 0)
    return [sum(total[d:]) / rounds for d in range(1, deepest + 1)]


def conditional_acceptance(rates: list[float]) -> list[float | None]:
    """Conditional acceptance at depth d = acceptance rate at d / that at d - 1 (1 before depth 1): among the rounds
    that accepted d - 1 drafts, the share that accepted the d-th too, the drafter's accuracy at a depth it reached;
    None where no round reached d - 1."""
    before = [1.0, *rates[:-1]]
    return [rate / reached if reached > 0 else None for rate, reached in zip(rates, before)]


def length_mismatches(records: list[dict]) -> int:
    """Length mismatches = successful requests sent with ignore_eos whose output length N differs from
    max_new_tokens."""
    return sum(
        1
        for r in records
        if r["error"] is None and r.get("expected_tokens") is not None and r["output_tokens"] != r["expected_tokens"]
    )


def tokens_per_chunk(records: list[dict]) -> float | None:
    """Tokens per chunk = sum of tokens in later chunks / number of later chunks (client-side acceptance estimate)."""
    tokens = sum(sum(r["chunk_tokens"][1:]) for r in records if r["error"] is None)
    chunks = sum(len(r["chunk_tokens"]) - 1 for r in records if r["error"] is None)
    return tokens / chunks if chunks else None


# ---------------------------------------------------------------- service-level objectives
# An SLO's targets: {"ttft_ms": ..., "tpot_ms": ..., "itl_ms": ...}, each in milliseconds, None or absent where the
# SLO sets none (specsweep.slo.Objective.targets).

Z_975 = 1.959964  # the standard normal's 0.975 quantile: the Wilson interval's z at 95%


def slo_met(r: dict, targets: dict) -> bool:
    """Meets an SLO = the request succeeded and every target the SLO sets holds: TTFT <= ttft_ms, TPOT <= tpot_ms
    (a request whose tokens all came in its first chunk has no TPOT and meets that target, as vLLM and SGLang count
    it) and its largest per-token ITL <= itl_ms (every token within the target); a failed request meets none.
    Judged per request, as SGLang's and vLLM's bench --goodput, GuideLLM, AIPerf and inference-perf judge it."""
    if r["error"] is not None or not r["chunk_times"]:
        return False
    measured: dict[str, float | None] = {
        "ttft_ms": ttft(r),
        "tpot_ms": tpot(r),
        "itl_ms": max(itl_per_token(r), default=None),
    }
    for key, limit in targets.items():
        value = measured[key]
        if limit is not None and value is not None and value * 1000.0 > limit:
            return False
    return True


def wilson_interval(share: float, n: float) -> list[float] | None:
    """Wilson score 95% interval of a share observed over n independent units: (p + z^2/2n +- z sqrt(p(1-p)/n +
    z^2/4n^2)) / (1 + z^2/n), z = 1.96; at p = 1 its lower bound is n / (n + z^2). None without a unit."""
    if n <= 0:
        return None
    z2 = Z_975**2
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_975 * math.sqrt(max(0.0, share * (1 - share)) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def slo_attainment(records: list[dict], targets: dict, seed: int = 0) -> dict:
    """SLO attainment = requests that met the SLO (slo_met) / requests sent, a failed request counted as missing it
    (as GuideLLM's SLO attainment and AIPerf's good_request_fraction count it); 95% interval: the Wilson score
    interval at the share's effective number of requests, n p(1-p) / (n x the variance of the share in a bootstrap
    over sessions within their content kind), between the sessions and the requests: where requests of one session
    go together, as the turns of a multi-turn session do, they count as fewer; with fewer than MIN_SESSIONS
    sessions, or where every request met it (every resample gives 1) or none did, the sessions. With n sessions of
    one request each, all meeting it, the lower bound is n / (n + 1.96^2): 0.89 for 32.

    Returns {"share", "share_ci", "met" (requests), "sent", "sessions", "effective" (the n of its interval)}."""
    per_session: dict = {}
    for r in records:
        met, sent, _ = per_session.get(r["session"], (0, 0, r["kind"]))
        per_session[r["session"]] = (met + slo_met(r, targets), sent + 1, r["kind"])
    met = sum(v[0] for v in per_session.values())
    sent = sum(v[1] for v in per_session.values())
    out: dict = {"share": met / sent if sent else None, "share_ci": None, "met": met, "sent": sent}
    out["sessions"] = out["effective"] = len(per_session)
    if not sent:
        return out
    share = out["share"]
    if len(per_session) >= MIN_SESSIONS and 0 < met < sent:
        units = list(per_session.values())
        w = _resample([v[2] for v in units], seed)
        boot = (w @ np.array([v[0] for v in units], dtype=float)) / (w @ np.array([v[1] for v in units], dtype=float))
        variance = float(np.var(boot, ddof=1))
        if variance > 0:
            out["effective"] = min(sent, max(len(units), share * (1 - share) / variance))
    out["share_ci"] = wilson_interval(share, out["effective"])
    return out


def goodput(records: list[dict], targets: dict, window: list[float] | None = None) -> float | None:
    """Goodput = output tokens of the requests that met the SLO (slo_met) arriving inside the steady-state window /
    its length (tokens/s): output_throughput counting those requests only."""
    window = window or measurement_window(records)
    if window is None or window[1] <= window[0]:
        return None
    return sum(_tokens_in(r, *window) for r in records if slo_met(r, targets)) / (window[1] - window[0])


def goodput_ci(records: list[dict], targets: dict, window: list[float] | None = None, seed: int = 0):
    """95% CI of goodput: throughput_ci's bootstrap over sessions, each session's tokens those of its requests that
    met the SLO (the engine seconds charged to it all of them); none below MIN_SESSIONS sessions."""
    return _charged_ratio_ci(records, window, seed, counted=lambda r: slo_met(r, targets))


def request_goodput(records: list[dict], targets: dict, window: list[float] | None = None) -> float | None:
    """Request goodput = requests that met the SLO and ended (their last content chunk) inside the steady-state
    window / its length (requests/s): the anchors' goodput (vLLM's and SGLang's request_goodput, AIPerf's and
    GuideLLM's goodput, inference-perf's request goodput), over the steady-state window as throughput is."""
    window = window or measurement_window(records)
    if window is None or window[1] <= window[0]:
        return None
    ended = [r for r in records if slo_met(r, targets) and window[0] < r["chunk_times"][-1] <= window[1]]
    return len(ended) / (window[1] - window[0])


def slo_measures(records: list[dict], targets: dict, tp: int, window: list[float] | None, seed: int = 0) -> dict:
    """One SLO in one cell: its attainment (slo_attainment), goodput with its interval and per GPU (/ tp), and
    request goodput, over the cell's steady-state window."""
    attained = slo_attainment(records, targets, seed)
    tokens = goodput(records, targets, window)
    return {
        **attained,
        "goodput": tokens,
        "goodput_ci": goodput_ci(records, targets, window, seed),
        "goodput_per_gpu": tokens / tp if tokens is not None else None,
        "request_goodput": request_goodput(records, targets, window),
    }


def _weighted_percentiles(sorted_values: np.ndarray, weights: np.ndarray, ps: list[float]) -> list[np.ndarray]:
    """Per row of weights (copies of each sorted value, whole or not): the p-th percentile for each p in ``ps``,
    with numpy's linear rule: the values at copies floor(h) and floor(h) + 1, h = (copies - 1) p / 100."""
    total = weights.sum(axis=1)
    cum = np.cumsum(weights, axis=1)  # one cumulative sum serves every p
    h = (total[:, None] - 1) * np.asarray(ps, dtype=float)[None, :] / 100.0
    low = np.floor(h)
    bounds = np.concatenate([low + 1, np.minimum(low + 2, total[:, None])], axis=1)
    # per row, how many cumulative counts lie below each bound (the rows are sorted)
    index = np.array([np.searchsorted(row, b, side="left") for row, b in zip(cum, bounds)])
    last = len(sorted_values) - 1
    lo_v = sorted_values[np.minimum(index[:, : len(ps)], last)]
    hi_v = sorted_values[np.minimum(index[:, len(ps) :], last)]
    return list((lo_v + (h - low) * (hi_v - lo_v)).T)


def summarise(values: list, sessions: list | None = None, seed: int = 0, kinds: list | None = None) -> dict:
    """Mean and percentiles with their n, each with a 95% bootstrap CI resampling whole sessions (never single
    tokens); no CI below MIN_SESSIONS sessions, nor for percentile p with fewer than TAIL_VALUES values beyond it."""
    pairs = [
        (v, s, k)
        for v, s, k in zip(
            values,
            sessions if sessions is not None else range(len(values)),
            kinds if kinds is not None else [None] * len(values),
        )
        if v is not None and math.isfinite(v)
    ]
    out: dict = {"n": len(pairs)}
    if not pairs:
        return out
    data = np.array([v for v, _, _ in pairs], dtype=float)
    groups = {s: i for i, s in enumerate(dict.fromkeys(s for _, s, _ in pairs))}
    stratum = {s: k for _, s, k in pairs}
    out["sessions"] = len(groups)
    order = np.argsort(data, kind="stable")
    data_sorted = data[order]
    cluster = np.array([groups[s] for _, s, _ in pairs])[order]
    stats: dict[str, float | None] = {"mean": None, **{f"p{p}": p for p in PERCENTILES}}  # name: percentile
    out["mean"] = float(data.mean())
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(data, p))
    claimed = {
        name: len(groups) >= MIN_SESSIONS and (p is None or data.size * min(p, 100 - p) / 100 >= TAIL_VALUES)
        for name, p in stats.items()
    }
    boot: dict[str, list[np.ndarray]] = {name: [] for name, ok in claimed.items() if ok}
    if boot:
        counts = _resample([stratum[s] for s in groups], seed)
        percentiles = {name: p for name, p in stats.items() if name in boot and p is not None}
        for rows in np.array_split(
            np.arange(BOOTSTRAP_RESAMPLES), max(1, data.size * BOOTSTRAP_RESAMPLES // 2_000_000)
        ):
            weights = counts[rows][:, cluster]  # copies of each value in each resample
            for name, resampled in zip(
                percentiles, _weighted_percentiles(data_sorted, weights, list(percentiles.values()))
            ):
                boot[name].append(resampled)
            if "mean" in boot:
                boot["mean"].append(weights @ data_sorted / weights.sum(axis=1))
    for name in stats:
        out[f"{name}_ci"] = _interval(np.concatenate(boot[name])) if name in boot else None
    return out


def summarise_with_failures(values: list[float | None], failed: int) -> dict:
    """Percentiles with each failed request counted as +inf latency (reported beside the success-only ones)."""
    data = np.asarray([v for v in values if v is not None] + [math.inf] * failed, dtype=float)
    if data.size == 0:
        return {"n": 0}
    out: dict[str, float] = {"n": int(data.size)}
    for p in PERCENTILES:  # +inf where the percentile falls among the failures
        out[f"p{p}"] = float(np.percentile(data, p, method="inverted_cdf")) if failed else float(np.percentile(data, p))
    return out


def session_completion(records: list[dict]) -> list[float]:
    """Session completion time = last content chunk of its last turn - send time of its first turn (all turns
    successful)."""
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
            "requests": len(rows),
            "failed": len(rows) - len(ok),
            "ttft": _summary(ok, ttft, seed),
            "e2e": _summary(ok, e2e, seed),
            "prompt_tokens_mean": float(np.mean([r["prompt_tokens"] for r in ok])) if ok else None,
            "cached_tokens_mean": float(np.mean([r["cached_tokens"] for r in ok])) if ok else None,
        }
    return out


def acceptance_agreement(estimates: dict, tolerance: float = 0.02) -> dict:
    """Agreement of acceptance estimates: max relative difference to the request-level value; disagree above
    tolerance (2%)."""
    reference = estimates.get("acceptance_length")
    others = {k: v for k, v in estimates.items() if k != "acceptance_length" and v is not None}
    if reference is None or not others:
        return {"max_relative_difference": None, "disagree": False}
    diff = max(abs(v - reference) / reference for v in others.values())
    return {"max_relative_difference": diff, "disagree": bool(diff > tolerance)}


def failures(records: list[dict]) -> dict:
    """Failed requests by category (connect, http_status, timeout, truncated, server_died, server_error, aborted,
    client_error)."""
    out: dict = {}
    for r in records:
        if r["error"]:
            out[r["error"]] = out.get(r["error"], 0) + 1
    return out


def _summary(rows: list[dict], metric, seed: int = 0) -> dict:
    """summarise() of a per-request metric (one value) or a per-token one (a list) over rows, each value
    labelled with its request's session and content kind."""
    values, sessions, kinds = [], [], []
    for r in rows:
        value = metric(r)
        for v in value if isinstance(value, list) else [value]:
            values.append(v)
            sessions.append(r["session"])
            kinds.append(r["kind"])
    return summarise(values, sessions, seed, kinds)


def user_ttft(r: dict) -> float | None:
    """User TTFT = t_first - t_sched: TTFT plus the queue delay (the wait for a free slot under open-loop load)."""
    return r["chunk_times"][0] - r["t_sched"] if r["chunk_times"] else None


def server_acceptance_length(counters: dict, completed: int) -> float | None:
    """Acceptance length (server) = (generation tokens - completed requests) / verify calls, from the server's
    Prometheus counters differenced over the measurement window (the prefill token of each request excluded)."""
    verify = counters.get("sglang:spec_verify_calls_total", 0.0)
    return (counters.get("sglang:generation_tokens_total", 0.0) - completed) / verify if verify else None


def gauge_summary(values: list[float]) -> dict:
    """A sampled gauge = mean and peak of its samples, with the number of samples (mean and peak None without
    one)."""
    if not values:
        return {"samples": 0, "mean": None, "peak": None}
    return {"samples": len(values), "mean": sum(values) / len(values), "peak": max(values)}


def server_load(sampled: dict) -> dict:
    """Server running and queued requests = gauge_summary of sglang:num_running_reqs and sglang:num_queue_reqs
    sampled while the cell was measured (``sampled``: the cell's server_load; cells written before the samples
    were kept give the sampler's own summary)."""
    if "gauges" not in sampled:
        n = sampled.get("samples", 0)
        return {
            name: {"samples": n, "mean": sampled.get(f"{name}_mean"), "peak": sampled.get(f"{name}_peak")}
            for name in ("running", "queued")
        }
    return {
        name: gauge_summary([sample[i] for sample in sampled["gauges"]]) for i, name in enumerate(("running", "queued"))
    }


def cell_metrics(
    records: list[dict],
    tp: int,
    concurrency: int,
    load_model: str = "closed",
    seed: int = 0,
    counters: dict | None = None,
) -> dict:
    """All per-cell aggregates (each defined in its function's docstring) from the measured (non-warm-up) request
    records and, where given, the server's counters differenced over the measurement window."""
    ok = [r for r in records if r["error"] is None]
    held = concurrency_report(records, concurrency, load_model)
    window = held["window"]
    throughput = output_throughput(records, window)
    acceptance = {
        "acceptance_length": acceptance_length(records),
        "acceptance_length_server": server_acceptance_length(counters or {}, len(ok)),
        "tokens_per_chunk": tokens_per_chunk(records),
    }
    return {
        "requests_sent": len(records),
        "requests_completed": len(ok),
        "requests_failed": len(records) - len(ok),
        "failures": failures(records),
        "length_mismatches": length_mismatches(records),
        "output_tokens": int(sum(r["output_tokens"] for r in ok)),
        "concurrency": held,
        "output_throughput": throughput,
        "output_throughput_ci": throughput_ci(records, window, seed),
        "output_throughput_per_gpu": throughput / tp if throughput is not None else None,
        "output_throughput_run": output_throughput(records),
        "ttft": _summary(ok, ttft, seed),
        "user_ttft": _summary(ok, user_ttft, seed),
        "tpot": _summary(ok, tpot, seed),
        "itl": _summary(ok, itl_per_token, seed),
        "e2e": _summary(ok, e2e, seed),
        "interactivity": _summary(ok, interactivity, seed),
        "queue_delay": _summary(records, queue_delay, seed),
        "chunk_gap": _summary(ok, chunk_gaps, seed),
        "ttft_with_failures": summarise_with_failures([ttft(r) for r in ok], len(records) - len(ok)),
        "e2e_with_failures": summarise_with_failures([e2e(r) for r in ok], len(records) - len(ok)),
        "session_completion": summarise(session_completion(records), None, seed),
        "per_turn": per_turn(records, seed) if any(r["turn"] for r in records) else {},
        **acceptance,
        "acceptance_agreement": acceptance_agreement(acceptance),
        "acceptance_by_depth": acceptance_by_depth(records),
        "acceptance_length_per_request": acceptance_length_per_request(records),
        "acceptance_length_sglang": acceptance_length_sglang(records),
    }


def cell_measures(cell: dict) -> dict:
    """Every metric of one cell JSON, computed from its raw records by today's formulas (the metrics stored in a
    cell are a copy for readers, never read back): cell_metrics of its requests at its TP, concurrency, load model
    and seed, with its server counters; its server load (server_load); its precision (metric_precision of its
    precision metric)."""
    c = cell["cell"]
    out = cell_metrics(
        cell["requests"], c["tp"], c["concurrency"], cell["load"]["model"], cell["seed"], cell["server_counters"]
    )
    out["server_load"] = server_load(cell.get("server_load") or {})
    out["precision"] = metric_precision(out, (cell.get("precision") or {}).get("metric", "output_throughput"))
    return out


def metric_precision(metrics: dict, metric: str = "output_throughput") -> float | None:
    """Relative precision of a cell's metric (output_throughput or <metric>.<stat>) from its cell_metrics:
    precision_of its estimate and interval."""
    if metric == "output_throughput":
        return precision_of(metrics["output_throughput"], metrics["output_throughput_ci"])
    name, stat = metric.split(".")
    return precision_of(metrics[name].get(stat), metrics[name].get(f"{stat}_ci"))


def _first_paragraph(func) -> tuple[str, str]:
    """(name, the first paragraph of its docstring on one line), the constants it names given their values."""
    text = " ".join((func.__doc__ or "").strip().split("\n\n")[0].split())
    return func.__name__, text.replace("MIN_SESSIONS", str(MIN_SESSIONS)).replace("TAIL_VALUES", str(TAIL_VALUES))


def definitions() -> list[tuple[str, str]]:
    """(name, definition) for every metric: the first paragraph of each docstring, whole sentences."""
    funcs = [
        ttft,
        user_ttft,
        e2e,
        tpot,
        interactivity,
        itl_per_token,
        chunk_gaps,
        queue_delay,
        end_time,
        achieved_concurrency,
        steady_window,
        output_throughput,
        slo_met,
        slo_attainment,
        goodput,
        request_goodput,
        acceptance_length,
        acceptance_length_per_request,
        acceptance_length_sglang,
        acceptance_by_depth,
        conditional_acceptance,
        kind_throughput,
        tokens_per_chunk,
        length_mismatches,
        acceptance_agreement,
        summarise_with_failures,
        session_completion,
        per_turn,
        failures,
        first_divergence,
        losslessness,
    ]
    return [_first_paragraph(f) for f in funcs]


def statistics() -> list[tuple[str, str]]:
    """(name, explanation) of how intervals are made, from the docstrings of the functions that make them (the
    steady-state window they rest on is among the definitions)."""
    return [
        _first_paragraph(f)
        for f in (
            summarise,
            throughput_ci,
            goodput_ci,
            wilson_interval,
            speedup,
            median_ratio,
            combine_launches,
            relative_precision,
        )
    ]


def speedup(
    method_records: list[dict],
    ar_records: list[dict],
    method_window: list[float] | None = None,
    ar_window: list[float] | None = None,
    seed: int = 0,
    kind: str | None = None,
) -> dict:
    """Speedup = output throughput of the method / that of AR, both over the sessions the two cells share; 95% CI by
    paired bootstrap over those sessions (the same pairs as the estimate; none below MIN_SESSIONS pairs).

    Each side is sum(tokens)/sum(charged seconds) over the shared sessions inside its own steady-state window (see
    throughput_ci); with every session in both cells this is each cell's own throughput. With ``kind``: over the
    shared sessions of that content kind alone, each side's seconds still charged over every request of its cell
    (kind_throughput), so that the speedup of a kind is the ratio of the two cells' kind_throughput.
    """
    if not method_records or not ar_records:
        return {"speedup": None, "speedup_ci": None, "pairs": 0}
    method_side, ar_side = _shares_and_scale(method_records, method_window), _shares_and_scale(ar_records, ar_window)
    if method_side is None or ar_side is None:
        return {"speedup": None, "speedup_ci": None, "pairs": 0}
    sides = [method_side, ar_side]
    common = [
        s
        for s in sides[0][0]
        if s in sides[1][0]
        and (sides[0][0][s][1] > 0 or sides[1][0][s][1] > 0)
        and (kind is None or sides[1][0][s][2] == kind)
    ]
    arrays = []
    for shares, scale in sides:
        n = np.array([shares[s][0] for s in common], dtype=float)
        d = np.array([shares[s][1] for s in common], dtype=float)
        arrays.append((n, d, scale))
    (na, da, ca), (nb, db, cb) = arrays
    if not common or da.sum() <= 0 or db.sum() <= 0 or nb.sum() <= 0:
        return {"speedup": None, "speedup_ci": None, "pairs": len(common)}
    out: dict = {
        "speedup": float((ca * na.sum() / da.sum()) / (cb * nb.sum() / db.sum())),
        "speedup_ci": None,
        "pairs": len(common),
    }
    if len(common) >= MIN_SESSIONS:
        w = _resample([sides[1][0][s][2] for s in common], seed)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["speedup_ci"] = _interval((ca * (w @ na) / (w @ da)) / (cb * (w @ nb) / (w @ db)))
    return out


def median_ratio(a: list[tuple], b: list[tuple], seed: int = 0) -> dict:
    """Median ratio = median of b's values / median of a's, both over the sessions the two share (``a``, ``b``:
    (value, session, kind) of each request); 95% CI by paired bootstrap over those sessions (one draw of sessions
    weighs both sides alike, within each session's kind; none below MIN_SESSIONS pairs)."""
    a = [t for t in a if t[0] is not None and math.isfinite(t[0])]
    b = [t for t in b if t[0] is not None and math.isfinite(t[0])]
    common = list(dict.fromkeys(s for _, s, _ in a if s in {s for _, s, _ in b}))
    out: dict = {"ratio": None, "ratio_ci": None, "pairs": len(common)}
    if not common:
        return out
    index = {s: i for i, s in enumerate(common)}
    sides = []
    for side in (a, b):
        kept = sorted((v, index[s]) for v, s, _ in side if s in index)
        sides.append((np.array([v for v, _ in kept], dtype=float), np.array([i for _, i in kept])))
    medians = [float(np.median(values)) for values, _ in sides]
    if medians[0] <= 0:
        return out
    out["ratio"] = medians[1] / medians[0]
    if len(common) >= MIN_SESSIONS:
        kind = {s: k for _, s, k in a}
        counts = _resample([kind[s] for s in common], seed)
        (va, ca), (vb, cb) = sides
        (ma,) = _weighted_percentiles(va, counts[:, ca], [50])
        (mb,) = _weighted_percentiles(vb, counts[:, cb], [50])
        with np.errstate(divide="ignore", invalid="ignore"):
            out["ratio_ci"] = _interval(mb / ma)
    return out


def combine_launches(estimates: list[float]) -> dict:
    """Across repetitions (separate launches): the mean of the launches' estimates with a 95% Student-t interval
    mean +- t(0.975, r-1) x sd / sqrt(r), so launch-to-launch variation is in it; none from a single launch."""
    values = np.array([v for v in estimates if v is not None and math.isfinite(v)], dtype=float)
    if values.size == 0:
        return {"mean": None, "ci": None, "launches": 0}
    mean = float(values.mean())
    if values.size < 2:
        return {"mean": mean, "ci": None, "launches": int(values.size)}
    half = T_975[min(values.size - 1, len(T_975)) - 1] * values.std(ddof=1) / math.sqrt(values.size)
    return {"mean": mean, "ci": [mean - half, mean + half] if half > 0 else None, "launches": int(values.size)}


def first_divergence(tokens: list[str], reference: list[str]) -> int | None:
    """First divergence = index of the first token where an output differs from the reference output (None if equal)."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def losslessness(method_records: list[dict], ar_records: list[dict]) -> dict:
    """Losslessness = share of requests whose output equals AR's for the same prompt (greedy), and first divergence
    positions."""
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


def relative_precision(
    records: list[dict],
    metric: str = "output_throughput",
    concurrency: int = 1,
    load_model: str = "closed",
    seed: int = 0,
) -> float | None:
    """Relative precision = half-width of the metric's 95% CI / its value, with the cell's own intervals (None while
    no interval is claimed: too few sessions, or a zero-width one)."""
    if metric == "output_throughput":
        window = steady_window(records, concurrency, load_model)
        point, ci = output_throughput(records, window), throughput_ci(records, window, seed)
    else:
        name, stat = metric.split(".")
        per_request = {"ttft": ttft, "tpot": tpot, "itl": itl_per_token, "e2e": e2e, "interactivity": interactivity}
        summary = _summary([r for r in records if r["error"] is None], per_request[name], seed)
        point, ci = summary.get(stat), summary.get(f"{stat}_ci")
    return precision_of(point, ci)


def precision_of(point: float | None, ci: list[float] | None) -> float | None:
    """Half-width of an interval / its estimate; None without an estimate or a claimed, non-zero-width interval."""
    if not point or not ci or ci[1] <= ci[0]:
        return None
    return (ci[1] - ci[0]) / 2 / abs(point)
