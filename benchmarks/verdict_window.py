"""Time-based looks for budget: verdict, replayed on the simulator: an experiment (nothing in the package uses it),
the evidence for docs/budget.md's "Limits" on the looks before the last at concurrency 16 and 64.

    .venv/bin/python benchmarks/verdict_window.py --seeds 1 2 --out window-rows.json
    .venv/bin/python benchmarks/verdict_window.py --report window-rows.json

For every speculative cell of plan-full's subset (benchmarks/verdict_budget.SUBSET), replayed once per seed:
- exhaustive: metrics.speedup over all sessions (bootstrap), its state, cost = whole cell;
- today: verdict_budget.stopped (looks at the first n_k sessions in start order once all have completed);
- window looks, four variants = rule x start of window:
    rule "start": T_k = the moment the n_k-th session (start order) starts;
    rule "count": T_k = the moment the (n_k + c)-th session starts (= the n_k-th completion, any sessions),
                  at most the last session's start;
    window from "w0": the c-th send (the moment the loop first held c, as running_shares);
    window from "w1": the first end of any request (the first wave's first session ends), on each side its own.
  Method side: every session in flight in [a, T_k] (its tokens that arrived in (a, T_k], its time in flight inside
  [a, T_k] / c); AR side: AR's full-cell running shares of the same sessions (w0 variant: running_shares; w1
  variant: tokens after AR's own first end, time after it / c); sequential.log_ratio_interval at look_alphas' alpha_k,
  decide(). Looks k = 1..K-1 only (T_k before the last start); the last look as today (look_interval final=True).
  Cost = T_k of the first decided look, else the cell's end.
Also every variant's point estimate at look 1 (decided or not) against the exhaustive speedup: the bias check.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verdict_budget as vb  # noqa: E402

from specsweep import metrics, sequential, verdict  # noqa: E402
from specsweep.jobs import cell_requests, workload_concurrency  # noqa: E402
from specsweep.methods import expand_methods  # noqa: E402
from specsweep.metrics import _tokens_in  # noqa: E402
from specsweep.sim.replay import closed_loop  # noqa: E402
from specsweep.workloads import build  # noqa: E402

RULES = ("start", "start1", "count")
STARTS = ("w0", "w1", "nowave")
AR_SIDES = ("running",)


def session_starts(records):
    """Session id -> send time of its first turn, and the ids in start order."""
    first = {r["session"]: r["t0"] for r in records if r["turn"] == 0}
    return first, sorted(first, key=lambda s: first[s])


def window_shares(records, a, b, c):
    """Per session in flight in [a, b]: (tokens arrived in (a, b], time in flight inside [a, b] / c, kind)."""
    out = {}
    for r in records:
        if r["t0"] >= b:
            continue
        end = r["t_end"] if r.get("t_end") is not None else b
        secs = max(0.0, min(end, b) - max(r["t0"], a)) / c
        n, d, _ = out.get(r["session"], (0, 0.0, None))
        out[r["session"]] = (n + _tokens_in(r, a, b), d + secs, r["kind"])
    return {s: v for s, v in out.items() if v[1] > 0}


def after_shares(records, a, c):
    """Per session: tokens after a, time in flight after a / c (AR's full cell, from its own moment a)."""
    out = {}
    for r in records:
        secs = max(0.0, r["t_end"] - max(r["t0"], a)) / c
        n, d, _ = out.get(r["session"], (0, 0.0, None))
        out[r["session"]] = (n + _tokens_in(r, a, math.inf), d + secs, r["kind"])
    return out


def window_look(records, ar, c, a_m, a_a, T, alpha, start, ar_side="running", skip=()):
    m = window_shares(records, a_m, T, c)
    scale = 1.0
    if ar_side == "steady":
        full, scale = metrics._shares_and_scale(ar, metrics.steady_window(ar, c))
    elif start == "w1":
        full = after_shares(ar, a_a, c)
    else:
        full = sequential.running_shares(ar, c)
    common = [s for s in m if s in full and s not in skip and (m[s][1] > 0 or full[s][1] > 0)]
    side = lambda sh: (  # noqa: E731
        np.array([sh[s][0] for s in common], float),
        np.array([sh[s][1] for s in common], float),
        1.0,
    )
    ms, fs = side(m), side(full)
    fs = (fs[0], fs[1], scale)
    res = sequential.log_ratio_interval(ms, fs, [full[s][2] for s in common], alpha)
    res["m_tp"] = float(ms[0].sum() / ms[1].sum()) if ms[1].sum() > 0 else None
    res["a_tp"] = float(scale * fs[0].sum() / fs[1].sum()) if fs[1].sum() > 0 else None
    res["decision"] = sequential.decide(res["speedup_ci"], 0.03)
    return res


def window_cell(records, ar, sessions, c, settings):
    """Every window variant's decision, cost, looks."""
    n = len(sessions)
    counts = sequential.look_sessions(n, settings.get("looks", 4), c)
    alphas = sequential.look_alphas(counts, settings.get("level", 0.95))
    first, order = session_starts(records)
    sends = sorted(r["t0"] for r in records)
    w0 = sends[min(c, len(sends)) - 1]
    w1 = min(r["t_end"] for r in records)
    w1_ar = min(r["t_end"] for r in ar)
    last_start = first[order[-1]]
    end = max(r["t_end"] for r in records)
    out = {}
    skipset = set(order[:c])
    for rule in RULES:
        for start in STARTS:
            for ar_side in AR_SIDES:
                if start == "w1" and ar_side == "steady":
                    continue
                a_m = w1 if start == "w1" else w0
                looks, chosen = [], None
                for k, (nk, alpha) in enumerate(zip(counts, alphas)):
                    if k == len(counts) - 1:
                        break
                    idx = nk if rule == "start" else min(n, nk + 1) if rule == "start1" else min(n, nk + c)
                    T = first[order[idx - 1]]
                    T = min(T, last_start)
                    if T <= a_m:
                        looks.append({"k": k + 1, "T": T, "speedup": None, "ci": None, "decision": "undecided"})
                        continue
                    res = window_look(
                        records, ar, c, a_m, w1_ar, T, alpha, start, ar_side, skipset if start == "nowave" else ()
                    )
                    look = {
                        "k": k + 1,
                        "T": T,
                        "speedup": res["speedup"],
                        "ci": res["speedup_ci"],
                        "decision": res["decision"],
                        "pairs": res.get("pairs"),
                        "m_tp": res.get("m_tp"),
                        "a_tp": res.get("a_tp"),
                    }
                    looks.append(look)
                    if chosen is None and res["decision"] != "undecided":
                        chosen = look
                if chosen is None:  # last look as today
                    res = sequential.look_interval(
                        records, ar, [s.id for s in sessions], c, alphas[-1], final=True, cap=n
                    )
                    chosen = {
                        "k": len(counts),
                        "T": end,
                        "speedup": res["speedup"],
                        "ci": res["speedup_ci"],
                        "decision": sequential.decide(res["speedup_ci"], 0.03),
                    }
                ci = chosen["ci"] or (None, None)
                out[f"{rule}/{start}/{ar_side}"] = {
                    "decision": chosen["decision"],
                    "look": chosen["k"],
                    "state": verdict.state(*ci),
                    "cost": chosen["T"],
                    "ci": list(ci),
                    "first_look": looks[0] if looks else None,
                    "looks": looks,
                }
    return out


NULL: list = []


def replay(config, seed):
    methods = expand_methods(config)
    ar_method = next(m for m in methods if not m.spec.speculative)
    settings = dict(config["verdict_stopping"])
    rows = []
    for tp in config["tp"]:
        for w in config["workloads"]:
            levels = workload_concurrency(config, w)
            most = max(cell_requests(w, c, config["load"]) for c in levels)
            sessions = build(dict(w, requests=most), seed, False, None, config["model"]["context_length"])
            cells = {c: sessions[: cell_requests(w, c, config["load"])] for c in levels}
            ar = {c: vb.closed_loop(vb.method_engine(ar_method, tp, seed), cells[c], c) for c in levels}
            for c in levels:  # null check: AR against itself (true speedup exactly 1): the window estimator's bias
                wc = window_cell(ar[c], ar[c], cells[c], c, settings)
                NULL.append(
                    {
                        "seed": seed,
                        "tp": tp,
                        "c": c,
                        **{v: (x["first_look"] or {}).get("speedup") for v, x in wc.items()},
                        **{
                            v + "#2": (x["looks"][1]["speedup"] if len(x["looks"]) > 1 else None) for v, x in wc.items()
                        },
                    }
                )
            for m in methods:
                if not m.spec.speculative:
                    continue
                for c in levels:
                    records = closed_loop(vb.method_engine(m, tp, seed), cells[c], c)
                    full = metrics.speedup(
                        records, ar[c], metrics.steady_window(records, c), metrics.steady_window(ar[c], c), seed=seed
                    )
                    lo, hi = full["speedup_ci"] or (None, None)
                    stop = vb.stopped(records, cells[c], ar[c], c, settings)
                    ci = stop["look"]["speedup_ci"] or (None, None)
                    # today's look 1 point estimate (fixed set of first n_1 sessions, running shares)
                    counts = sequential.look_sessions(len(cells[c]), settings.get("looks", 4), c)
                    t1 = sequential.look_interval(
                        records,
                        ar[c],
                        [s.id for s in cells[c][: counts[0]]],
                        c,
                        0.05,
                        final=len(counts) == 1,
                        cap=len(cells[c]),
                    )
                    end = max(r["t_end"] for r in records)
                    alphas = sequential.look_alphas(counts, settings.get("level", 0.95))
                    today_looks = [
                        dict(
                            sequential.look_interval(
                                records,
                                ar[c],
                                [s.id for s in cells[c][:nk]],
                                c,
                                a,
                                final=k == len(counts) - 1,
                                cap=len(cells[c]),
                            ),
                            k=k + 1,
                        )
                        for k, (nk, a) in enumerate(zip(counts, alphas))
                    ]

                    def tp_of(recs):
                        sh, sc = metrics._shares_and_scale(recs, metrics.steady_window(recs, c))
                        return sc * sum(v[0] for v in sh.values()) / sum(v[1] for v in sh.values())

                    rows.append(
                        {
                            "seed": seed,
                            "tp": tp,
                            "method": m.name,
                            "workload": w["name"],
                            "c": c,
                            "sessions": len(cells[c]),
                            "speedup": full["speedup"],
                            "exhaustive": verdict.state(lo, hi),
                            "exh_ci": [lo, hi],
                            "end": end,
                            "m_exh": tp_of(records),
                            "a_exh": tp_of(ar[c]),
                            "today": {
                                "decision": stop["look"]["decision"],
                                "look": stop["look"]["look"],
                                "state": verdict.state(*ci),
                                "cost": stop["cost"],
                                "ci": list(ci),
                                "first_speedup": t1["speedup"],
                                "looks": today_looks,
                            },
                            "window": window_cell(records, ar[c], cells[c], c, settings),
                        }
                    )
    return rows


def report(rows):
    variants = ["today"] + sorted(rows[0]["window"])
    get = lambda row, v: row["today"] if v == "today" else row["window"][v]  # noqa: E731
    for seed in sorted({r["seed"] for r in rows}) + ["all"]:
        sel = [r for r in rows if seed == "all" or r["seed"] == seed]
        print(f"\n## seed {seed}: {len(sel)} speculative cells (no implied/dominated skipping)")
        print(
            "| c | variant | cells | share of spec. time | agreement | flips | decided at look 1 | "
            "look-1 ratio median | worst low | worst high |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for c in sorted({r["c"] for r in sel}) + ["all"]:
            cs = [r for r in sel if c == "all" or r["c"] == c]
            for v in variants:
                share = sum(get(r, v)["cost"] for r in cs) / sum(r["end"] for r in cs)
                agree = sum(get(r, v)["state"] == r["exhaustive"] for r in cs) / len(cs)
                flips = sum({get(r, v)["state"], r["exhaustive"]} == {"faster", "slower"} for r in cs)
                l1 = sum(get(r, v)["look"] == 1 for r in cs)
                if v == "today":
                    ratios = [
                        r["today"]["first_speedup"] / r["speedup"]
                        for r in cs
                        if r["today"]["first_speedup"] and r["speedup"]
                    ]
                else:
                    ratios = [
                        get(r, v)["first_look"]["speedup"] / r["speedup"]
                        for r in cs
                        if get(r, v)["first_look"] and get(r, v)["first_look"]["speedup"] and r["speedup"]
                    ]
                med = f"{np.median(ratios):.3f}" if ratios else "-"
                lo = f"{min(ratios):.3f}" if ratios else "-"
                hi = f"{max(ratios):.3f}" if ratios else "-"
                print(f"| {c} | {v} | {len(cs)} | {share:.0%} | {agree:.1%} | {flips} | {l1} | {med} | {lo} | {hi} |")
        for v in variants[1:]:
            for r in sel:
                w = get(r, v)
                if w["state"] != r["exhaustive"]:
                    print(
                        f"  {v}: s{r['seed']} tp{r['tp']}/{r['method']}/{r['workload']}/c{r['c']}: exhaustive "
                        f"{r['exhaustive']} {r['speedup']:.3f} {r['exh_ci']} -> {w['state']} look {w['look']} "
                        f"ci {w['ci']}"
                    )
        for r in sel:
            if r["today"]["state"] != r["exhaustive"]:
                print(
                    f"  today: s{r['seed']} tp{r['tp']}/{r['method']}/{r['workload']}/c{r['c']}: exhaustive "
                    f"{r['exhaustive']} {r['speedup']:.3f} -> {r['today']['state']} look {r['today']['look']} "
                    f"ci {r['today']['ci']}"
                )


def decomposition(rows):
    """Per variant, concurrency and look k: the estimate / exhaustive speedup, split into the method side's window
    throughput / its exhaustive throughput and AR's side / AR's exhaustive throughput (medians; min-max of the
    ratio)."""
    print("\n## bias by look: ratio = estimate / exhaustive speedup = method factor / AR factor (both seeds)")
    print(
        "| variant | c | look | T / cell end (median) | ratio median | ratio min | ratio max "
        "| method factor | AR factor |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for v in sorted(rows[0]["window"]):
        for c in sorted({r["c"] for r in rows}):
            cs = [r for r in rows if r["c"] == c]
            for k in range(1, 4):
                ls = [(r, lk) for r in cs for lk in r["window"][v]["looks"] if lk["k"] == k and lk.get("m_tp")]
                if not ls:
                    continue
                rat = [lk["speedup"] / r["speedup"] for r, lk in ls]
                mf = [lk["m_tp"] / r["m_exh"] for r, lk in ls]
                af = [lk["a_tp"] / r["a_exh"] for r, lk in ls]
                tt = [lk["T"] / r["end"] for r, lk in ls]
                print(
                    f"| {v} | {c} | {k} | {np.median(tt):.2f} | {np.median(rat):.3f} | {min(rat):.3f} | "
                    f"{max(rat):.3f} | {np.median(mf):.3f} | {np.median(af):.3f} |"
                )


def coverage(rows):
    """Per variant, concurrency and look: how many look intervals (each at its alpha_k) contain the cell's exhaustive
    speedup (a rough check: the exhaustive point estimate over every session stands for the truth)."""
    print("\n## coverage: look intervals containing the exhaustive speedup")
    for v in ["today"] + sorted(rows[0]["window"]):
        cov: dict = defaultdict(lambda: [0, 0])
        for r in rows:
            looks = r["today"]["looks"] if v == "today" else r["window"][v]["looks"]
            for look in looks:
                ci = look.get("speedup_ci") or look.get("ci")
                if ci:
                    cov[(r["c"], look["k"])][1] += 1
                    cov[(r["c"], look["k"])][0] += ci[0] <= r["speedup"] <= ci[1]
        print(v, "; ".join(f"c{c} look {k}: {a}/{b}" for (c, k), (a, b) in sorted(cov.items())))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="*", default=[1])
    p.add_argument("--out", default="window-rows.json")
    p.add_argument("--report", default=None)
    args = p.parse_args()
    if args.report:
        rows = json.loads(Path(args.report).read_text())
        report(rows)
        decomposition(rows)
        coverage(rows)
        return
    config = vb.load("plan-full.yaml", vb.SUBSET)
    rows = []
    for seed in args.seeds:
        began = time.process_time()
        rows += replay(config, seed)
        print(f"seed {seed}: {time.process_time() - began:.0f} s CPU", file=sys.stderr, flush=True)
        Path(args.out).write_text(json.dumps(rows))
    Path(args.out).with_suffix(".null.json").write_text(json.dumps(NULL))
    print("\n## null check: AR against itself, estimate at look 1 (and look 2), per tp/c over seeds")
    for v in sorted(rows[0]["window"]):
        print(
            v,
            "; ".join(
                f"tp{n['tp']}/c{n['c']}/s{n['seed']}: {n[v] if n[v] is None else round(n[v], 3)}"
                f" / {n[v + '#2'] if n[v + '#2'] is None else round(n[v + '#2'], 3)}"
                for n in NULL
            ),
        )
    report(rows)
    decomposition(rows)


if __name__ == "__main__":
    main()
