"""Verdict-driven stopping (``budget: verdict``): a cell measures its sessions in rounds and stops once its verdict
against AR is decided, with a speedup interval that stays valid under that optional stopping.

A cell of ``requests`` sessions (its cap: what ``budget: exhaustive`` measures) is looked at K times
(``verdict_stopping.looks``), after the first n_1 < n_2 < ... < n_K = requests sessions have completed
(look_sessions: n_k = max(MIN_SESSIONS, FIRST_WAVES x concurrency, ceil(k x requests / K)), at most ``requests``,
repeated counts dropped). At look k the paired speedup over AR's cell of the
same (TP, workload, concurrency), measured in full before it, is estimated over those n_k sessions (look_interval).

The interval at look k is a delta-method interval on the log speedup at its own level 1 - alpha_k, where the
overall alpha = 1 - level is split over the K looks by information (a weighted Bonferroni split, the alpha-spending
of a fixed maximum number of looks):

    alpha_k = alpha x n_k / (n_1 + ... + n_K)                      (alpha_1 + ... + alpha_K = alpha)
    S = (c_m x sum(w t_m) / sum(w s_m)) / (c_a x sum(w t_a) / sum(w s_a))  (over the n_k sessions shared with AR)
    u_i = w_i (t_m,i / sum(w t_m) - s_m,i / sum(w s_m) - t_a,i / sum(w t_a) + s_a,i / sum(w s_a))  (i's influence)
    se^2 = sum over content kinds h of n_h / (n_h - 1) x sum over i in h of (u_i - mean_h(u))^2
    interval = [S x exp(-z x se), S x exp(z x se)],  z = Phi^-1(1 - alpha_k / 2)

(t: a session's output tokens, s: the engine seconds charged to it, c: the cell's charged seconds per second of
window, w: a session's weight. Before the last look, while sessions are still being started, a request is charged
its time in the loop after the loop first held its concurrency, divided by the concurrency, c = 1 (running_shares),
and the first wave's sessions weigh what they weigh in the whole cell (first_wave_weights); at the last look every
session's steady-state window charge, as metrics.speedup has it, and w = 1.) Since the K intervals together miss the
true speedup with probability at most alpha_1 + ... + alpha_K = alpha (Bonferroni's inequality), the interval of the
look at which the cell stops, whichever rule chose it, covers with probability at least ``level``.

The decision at a look (decide): faster where the interval lies above 1, slower where it lies below 1, equivalent
where it lies inside the equivalence band [1 - delta, 1 + delta] (``verdict_stopping.equivalence``); otherwise the
cell goes on to its next look, or stops at its cap undecided. An equivalent cell is inconclusive in the verdict's
three states (its interval contains 1 or lies close to it): it stops because more sessions would not change what to
deploy there by more than delta.

Pure numbers over request records: no server, no Snakemake.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from .metrics import MIN_SESSIONS, _shares_and_scale, _tokens_in, steady_window

FASTER, SLOWER, EQUIVALENT, UNDECIDED = "faster", "slower", "equivalent", "undecided"
DEFAULTS = {"looks": 4, "equivalence": 0.03, "level": 0.95}


FIRST_WAVES = 2  # the fewest waves of sessions (x the concurrency) a look before the last counts


def look_sessions(requests: int, looks: int, concurrency: int = 1) -> list[int]:
    """The session counts n_1 < ... < n_K = ``requests`` at which a cell of ``requests`` sessions is looked at:
    n_k = max(MIN_SESSIONS, FIRST_WAVES x concurrency, ceil(k x requests / K)), at most ``requests``, repeated counts
    dropped (a small cell has fewer looks).

    A look counts at least two waves of sessions: the first wave starts together (its prefills batched, its requests
    in step), a transient the later waves do not share; a look of that wave alone prices it as the cell's steady
    state (on the simulator at concurrency 64, AR's first wave runs 17.5% above the rest of its cell, EAGLE-3's
    3.5%, enough to call a cell of exhaustive speedup 1.07 slower). Beyond the first wave, a look weighs that wave as
    the whole cell does (first_wave_weights)."""
    floor = max(MIN_SESSIONS, FIRST_WAVES * concurrency)
    counts = [min(requests, max(floor, math.ceil(k * requests / looks))) for k in range(1, looks + 1)]
    return sorted(set(counts))


def look_alphas(counts: Sequence[int], level: float) -> list[float]:
    """alpha_k = (1 - level) x n_k / sum(n): the overall alpha split over the looks by their session counts."""
    total = float(sum(counts))
    return [(1.0 - level) * n / total for n in counts]


def decide(ci: Sequence[float] | None, equivalence: float) -> str:
    """A look's decision from its interval [lo, hi]: faster where lo > 1, slower where hi < 1, equivalent where
    1 - equivalence <= lo and hi <= 1 + equivalence, else undecided (also without an interval)."""
    if ci is None:
        return UNDECIDED
    lo, hi = ci
    if lo > 1:
        return FASTER
    if hi < 1:
        return SLOWER
    if 1 - equivalence <= lo and hi <= 1 + equivalence:
        return EQUIVALENT
    return UNDECIDED


def log_ratio_interval(
    method_side: tuple[np.ndarray, np.ndarray, float],
    ar_side: tuple[np.ndarray, np.ndarray, float],
    kinds: Sequence[str],
    alpha: float,
    weights: np.ndarray | None = None,
) -> dict:
    """The paired speedup S and its delta-method interval at level 1 - ``alpha`` (the module's formula) from each
    side's per-session (tokens, seconds, scale), sessions aligned, each session weighted by ``weights`` (1 where
    None); no interval below MIN_SESSIONS sessions or where it has no width."""
    (tm, sm, cm), (ta, sa, ca) = method_side, ar_side
    n = len(tm)
    if weights is not None:
        tm, sm, ta, sa = (weights * x for x in (tm, sm, ta, sa))
    if n == 0 or min(tm.sum(), sm.sum(), ta.sum(), sa.sum()) <= 0:
        return {"speedup": None, "speedup_ci": None, "pairs": n}
    point = (cm * tm.sum() / sm.sum()) / (ca * ta.sum() / sa.sum())
    out: dict = {"speedup": float(point), "speedup_ci": None, "pairs": n}
    if n < MIN_SESSIONS:
        return out
    u = tm / tm.sum() - sm / sm.sum() - ta / ta.sum() + sa / sa.sum()
    labels = np.asarray(kinds)
    var = 0.0
    for label in dict.fromkeys(kinds):
        part = u[labels == label]
        if len(part) > 1:
            var += len(part) / (len(part) - 1) * float(((part - part.mean()) ** 2).sum())
    half = NormalDist().inv_cdf(1 - alpha / 2) * math.sqrt(var)
    if half > 0:
        out["speedup_ci"] = [float(point * math.exp(-half)), float(point * math.exp(half))]
    return out


FIRST_WAVE_WEIGHED = "weighed as in the whole cell"  # a verdict cell's precision: how its looks counted the first wave


def first_wave_weights(sessions: Sequence[str], concurrency: int, cap: int) -> dict:
    """Per session of a look before the last (``sessions``: its first n_k sessions in start order, of a cell of
    ``cap``): the first wave's ``concurrency`` sessions weigh (n_k - concurrency) / (cap - concurrency), the others 1,
    so that the first wave is concurrency / cap of the look's weight, as it is of the whole cell's sessions (all 1
    where the look has no session beyond the first wave, or the cell none).

    The first wave of a closed loop starts together, its prefills batched and its requests in step, a transient the
    later waves do not share and that AR gains more from than a speculative method (on the simulator at concurrency
    64, AR's first wave ran 17.5% above the rest of its cell, EAGLE-3's 3.5%). Counted one for one, the first wave
    is half of a look of two waves but a quarter of a cell of four, so the look estimated a speedup of its own,
    below the cell's: replaying plan-full's subset on the simulator (five seeds, 110 speculative cells per
    concurrency), the first look at 64 had a median 0.948 of the exhaustive speedup and its interval contained it in
    44 of 110 cells; with the first wave weighed as in the whole cell, a median 0.983 and 110 of 110 (the second
    look 109 of 110, from 105), the looks at 1, 4 and 16 covering as before (108-110 of 110). The weights leave a
    bias of 1.7-2.5% in the first look's median at 4 to 64 (the running charge is not the steady-state window's),
    within its interval at its level; see docs/budget.md, "Limits"."""
    n = len(sessions)
    if n <= concurrency or cap <= concurrency:
        return {s: 1.0 for s in sessions}
    weight = (n - concurrency) / (cap - concurrency)
    return {s: weight if i < concurrency else 1.0 for i, s in enumerate(sessions)}


def running_shares(records: list[dict], concurrency: int) -> dict:
    """Per session of ``records``: (output tokens that arrived after the loop first held its concurrency, seconds
    charged to it, its content kind), a request charged its time in flight after that moment / ``concurrency``.

    In a closed loop without think time, ``concurrency`` requests are in flight from the moment the first
    ``concurrency`` have started (w0, the concurrency-th earliest send) until the last session starts, so that this
    is the engine time each request held one of the loop's slots: the charge of metrics' steady-state window where
    the requests shared steps evenly. It needs no request but these: a look taken while sessions are still being
    started is computed again from the finished cell's records of its sessions alone."""
    sends = sorted(r["t0"] for r in records)
    w0 = sends[min(concurrency, len(sends)) - 1] if sends else 0.0
    out: dict = {}
    for r in records:
        n, d, _ = out.get(r["session"], (0, 0.0, None))
        seconds = max(0.0, r["t_end"] - max(r["t0"], w0)) / concurrency if r.get("t_end") is not None else 0.0
        out[r["session"]] = (n + _tokens_in(r, w0, math.inf), d + seconds, r["kind"])
    return out


def look_interval(
    method_records: list[dict],
    ar_records: list[dict],
    sessions: Sequence[str],
    concurrency: int,
    alpha: float,
    final: bool = False,
    *,
    cap: int | None,
) -> dict:
    """The speedup at one look over the ``sessions`` looked at (in start order), paired with AR's cell on the same
    sessions; log_ratio_interval at ``alpha``. Before the last look (sessions still being started) each side's
    sessions are charged their time in the loop (running_shares), the first wave weighed as in the whole cell of
    ``cap`` sessions (first_wave_weights; counted one for one where ``cap`` is None); at the last look (``final``:
    every session of the cell) each side's steady-state window, as metrics.speedup charges them. The same records
    give the same interval here and in the aggregated tables."""
    chosen = set(sessions)
    sides = []
    for records in (method_records, ar_records):
        mine = [r for r in records if r["session"] in chosen]
        if not mine:
            return {"speedup": None, "speedup_ci": None, "pairs": 0}
        if final:
            parts = _shares_and_scale(mine, steady_window(mine, concurrency))
            if parts is None:
                return {"speedup": None, "speedup_ci": None, "pairs": 0}
        else:
            parts = (running_shares(mine, concurrency), 1.0)
        sides.append(parts)
    (m_shares, m_scale), (a_shares, a_scale) = sides
    common = [s for s in m_shares if s in a_shares and (m_shares[s][1] > 0 or a_shares[s][1] > 0)]

    def side(shares: dict, scale: float) -> tuple[np.ndarray, np.ndarray, float]:
        return (
            np.array([shares[s][0] for s in common], dtype=float),
            np.array([shares[s][1] for s in common], dtype=float),
            scale,
        )

    weights = None
    if not final and cap is not None:
        by_session = first_wave_weights(list(sessions), concurrency, cap)
        weights = np.array([by_session[s] for s in common], dtype=float)
    kinds = [a_shares[s][2] for s in common]
    return log_ratio_interval(side(m_shares, m_scale), side(a_shares, a_scale), kinds, alpha, weights)


SESSION_SPREAD = 0.25  # predicted sd of one session's influence on log S x sqrt(n) (DFlash on the simulator: 0.2-0.28)


def sessions_needed(speedup: float, alpha: float, equivalence: float, spread: float = SESSION_SPREAD) -> float:
    """Sessions a cell's interval at ``alpha`` needs to decide at a true ``speedup``: the half-width on the log scale,
    z x spread / sqrt(n) (z = Phi^-1(1 - alpha / 2)), below |ln S| to exclude 1, or below ln(1 + equivalence) - |ln
    S| to lie inside the equivalence band, whichever needs fewer: n = (z x spread / margin)^2 (infinite where
    neither margin is positive)."""
    z, distance = NormalDist().inv_cdf(1 - alpha / 2), abs(math.log(speedup))
    margins = [m for m in (distance, math.log(1 + equivalence) - distance) if m > 0]
    return min((z * spread / m) ** 2 for m in margins) if margins else math.inf


def stopping_sessions(
    requests: int, speedup: float, settings: dict, spread: float = SESSION_SPREAD, concurrency: int = 1
) -> int:
    """The sessions a cell of ``requests`` sessions is predicted to stop after under budget: verdict at a true
    ``speedup``: the first look whose session count is at least what its own alpha needs (sessions_needed), else
    the cap."""
    settings = {**DEFAULTS, **settings}
    counts = look_sessions(requests, settings["looks"], concurrency)
    for n, alpha in zip(counts, look_alphas(counts, settings["level"])):
        if n >= sessions_needed(speedup, alpha, settings["equivalence"], spread):
            return n
    return requests


class Looks:
    """The looks of one cell: at each of look_sessions' counts, once those first sessions have all completed, the
    speedup interval at that look's alpha and its decision. ``order``: the cell's session ids in the order they are
    started; ``requests_of``: {session id: requests it sends} (1 + its follow-up turns).

    Look k counts the first n_k sessions of ``order``, a set fixed before the cell starts, never the sessions that
    happen to have finished: so a look's estimate does not depend on how long any session takes, and the sessions
    started after them may be aborted once a look decides (cells.measure_verdict) without changing it."""

    def __init__(self, order: Sequence[str], requests_of: dict, ar_records: list[dict], concurrency: int, settings):
        self.order, self.requests_of, self.ar = list(order), requests_of, ar_records
        self.concurrency, self.settings = concurrency, {**DEFAULTS, **settings}
        self.counts = look_sessions(len(self.order), self.settings["looks"], concurrency)
        self.alphas = look_alphas(self.counts, self.settings["level"])
        self.taken: list[dict] = []

    def ready(self, records: list[dict]) -> list[int]:
        """The looks not yet taken whose sessions have all completed (every request of each)."""
        done: dict = {}
        for r in records:
            done[r["session"]] = done.get(r["session"], 0) + 1
        return self.ready_after(done)

    def ready_after(self, done: dict) -> list[int]:
        """ready, from {session id: its requests completed}."""
        out = []
        for k in range(len(self.taken), len(self.counts)):
            if all(done.get(s, 0) >= self.requests_of[s] for s in self.order[: self.counts[k]]):
                out.append(k)
            else:
                break
        return out

    def take(self, k: int, records: list[dict]) -> dict:
        """Look ``k`` (0-based) on the records so far: its interval, decision and what it was taken on."""
        sessions = self.order[: self.counts[k]]
        final = k == len(self.counts) - 1
        result = look_interval(records, self.ar, sessions, self.concurrency, self.alphas[k], final, cap=len(self.order))
        look = {
            "look": k + 1,
            "sessions": len(sessions),
            "alpha": self.alphas[k],
            "speedup": result["speedup"],
            "speedup_ci": result["speedup_ci"],
            "decision": decide(result["speedup_ci"], self.settings["equivalence"]),
        }
        self.taken.append(look)
        return look

    def step(self, records: list[dict]) -> dict | None:
        """Take every look that is ready, in order; the first decided one (None while none is)."""
        for k in self.ready(records):
            look = self.take(k, records)
            if look["decision"] != UNDECIDED:
                return look
        return None

    def record(self, stopped: str) -> dict:
        """The cell's account of its stopping (its ``precision``): the settings, every look taken, the last one's
        interval and decision, the session ids it was taken on (so the tables compute it again from the records)."""
        last = self.taken[-1] if self.taken else None
        return {
            "metric": "output_throughput",  # the summary's precision column: the cell's own throughput's
            "adaptive": False,
            "budget": "verdict",
            **{k: self.settings[k] for k in DEFAULTS},
            "looks_planned": self.counts,
            "looks_taken": self.taken,
            "decision": last["decision"] if last else UNDECIDED,
            "look_sessions": self.order[: last["sessions"]] if last else [],
            "look_alpha": last["alpha"] if last else None,
            "look_final": last is not None and last["look"] == len(self.counts),
            "first_wave": FIRST_WAVE_WEIGHED,
            "stopped": stopped,
        }


def verdict_interval(cell: dict, ar_cell: dict) -> dict | None:
    """A cell measured under ``budget: verdict``: the speedup and interval of the look it stopped at, computed again
    from its records and AR's (look_interval) by the rule it stopped by: its first wave weighed as in the whole cell
    where its precision says so (``first_wave``), else counted one for one, as cells measured before the weights
    were; None for any other cell."""
    precision = cell.get("precision") or {}
    if precision.get("budget") != "verdict" or not precision.get("look_sessions"):
        return None
    return look_interval(
        cell["requests"],
        ar_cell["requests"],
        precision["look_sessions"],
        cell["cell"]["concurrency"],
        precision["look_alpha"],
        precision["look_final"],
        cap=precision["looks_planned"][-1] if precision.get("first_wave") == FIRST_WAVE_WEIGHED else None,
    )
