"""The fit: a runtime profile of the simulator's cost model fitted to a calibration's measured shapes.

The runtime parameters of the cost model (specsweep.modelling.cost.CostModel) that ``FITTED`` names start from
``prior()`` (the generic roofline runtime ``sglang`` with generic values for the parameters it lacks) and are fitted
to every measured shape by least squares on log(modelled / measured) (Levenberg-Marquardt in log coordinates,
efficiencies through a logistic; Huber's weights at two scatters, the scatter from the median residual, so that one
shape a hiccup of the host slowed does not pull the fit), each parameter within its bounds (RUNTIME_BOUNDS). The gpu
and model profiles (``sim.gpu``, ``sim.model_profile``) are given, not fitted; the parameters outside FITTED
come from the configured runtime (``sim.runtime``) or the prior: bandwidth_efficiency (one model at one TP cannot
tell a faster weight read from a larger fixed cost per layer), allreduce_latency (at one TP a per-layer constant
like layer_overhead, which absorbs it: a profile is fitted per TP), and the costs no HTTP measurement reaches
(the DDTree heap and rank probe, hybrid models' recurrent state). A fitted parameter is identified when the
measurements pin it to within ``IDENTIFIED_WITHIN`` (one standard error of its log, from the fit's Jacobian
and scatter). The others are not identified: a parameter no measured shape depends on, or one the shapes cannot
tell from another, is held (at the prior, or where the fit drove it, such as a cost put at zero); the rest keep
the fit's value, pinned less well (for instance cpu_step when the overlap scheduler hides the CPU behind every
measured step, or the NGRAM and draft-model parameters when no such method is configured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import CalibrationError
from ..modelling.cost import CHUNKED_PREFILL_SIZE, RUNTIME_BOUNDS, CostModel
from ..modelling.decoding import Decoding
from ..modelling.profiles import profiles


IDENTIFIED_WITHIN = 0.015  # a parameter is identified when one standard error of its log is below this


NOISE_FLOOR = 0.003  # the smallest residual scatter assumed (log units) when the fit is closer than this


# the parameters the fit may move (every one the HTTP measurements can reach)
FITTED = (
    "compute_efficiency",
    "roofline_exponent",
    "layer_overhead",
    "attention_bandwidth_efficiency",
    "attention_request_efficiency",
    "attention_compute_efficiency",
    "prefill_fixed",
    "cpu_step",
    "spec_cpu_per_request",
    "drafter_fraction",
    "verify_attention_reads",
    "verify_request_attention_reads",
    "verify_per_request",
    "shared_kv_reads",
    "draft_step_overhead",
    "draft_layer_overhead",
    "draft_attention_reads",
    "draft_per_request",
    "draft_tree_per_node",
    "ngram_step_overhead",
    "ngram_cpu_per_request",
    "ngram_cpu_per_node",
    "request_latency",
    "request_latency_per_token",
    "drafter_prefill_fraction",
    "drafter_prefill_fixed",
)


# where the fit starts (every FITTED parameter: starting points, not values of any engine); the parameters outside
# FITTED come from the generic roofline runtime ``sglang`` (prior), itself the fit of these to an H200's records
GENERIC = {
    "compute_efficiency": 0.6,
    "layer_overhead": 12e-6,
    "drafter_fraction": 0.18,
    "roofline_exponent": 4.0,
    "attention_bandwidth_efficiency": 0.5,
    "attention_request_efficiency": 0.1,
    "attention_compute_efficiency": 0.3,
    "prefill_fixed": 5e-3,
    "cpu_step": 1e-3,
    "spec_cpu_per_request": 1e-6,
    "verify_attention_reads": 3.0,
    "verify_request_attention_reads": 3.0,
    "verify_per_request": 5e-5,
    "shared_kv_reads": 0.5,
    "drafter_per_token": True,
    "draft_step_overhead": 2e-4,
    "draft_layer_overhead": 4e-5,
    "draft_attention_reads": 3.0,
    "draft_per_request": 5e-5,
    "draft_tree_per_node": 5e-6,
    "ngram_step_overhead": 1e-3,
    "ngram_cpu_per_request": 2.5e-4,
    "ngram_cpu_per_node": 2e-6,
    "request_latency": 5e-3,
    "request_latency_per_token": 5e-7,
    "drafter_prefill_fraction": 0.2,
    "drafter_prefill_fixed": 2e-3,
}


def prior() -> dict:
    """The runtime the fit starts from: the shipped generic ``sglang`` runtime with GENERIC's starting points for
    the FITTED parameters (so that a fit does not start at its own answer: the generic runtime is fitted too)."""
    return {**profiles()["runtimes"]["sglang"], **GENERIC}


def modelled_seconds(cost: CostModel, row: dict) -> float:
    """The simulator's seconds for a measured row, as its engine charges a step (sim.engine.Engine.next_step):
    a prefill row: the prefill of c tokens in steps of its server's chunked-prefill size (8192 where the row does
    not say; each step prefill(n, n x done + n^2 / 2) with the server's drafter's extend) + an AR step of the
    admitted request + the streaming request's step of the server's decoding;
    a first-token row: the request's request_latency + the same prefill steps and AR step of the request alone;
    a step row: one decode_step of its decoding over ``batch`` requests at its context (NGRAM's trie holding the
    row's trie_tokens where it says)."""
    decoding = Decoding(**row["decoding"])
    if row["kind"] in ("prefill", "first-token"):
        c, chunk = row["context"], row.get("chunk") or CHUNKED_PREFILL_SIZE
        size = chunk if chunk > 0 else c
        parts = [min(size, c - done) for done in range(0, c, size)]
        alone = sum(cost.prefill(n, n * (i * size) + n * n / 2, decoding) for i, n in enumerate(parts))
        alone += cost.decode_step(Decoding(), [c])
        if row["kind"] == "first-token":
            return cost.request_latency(c) + alone
        return alone + cost.decode_step(decoding, [row["stream_context"]])
    if row["kind"] == "one-batch-prefill":  # bench_one_batch's prefill of the whole batch, no decode
        tokens = row["batch"] * row["width"]
        return cost.prefill(tokens, row["batch"] * row["width"] ** 2 / 2)
    return cost.decode_step(decoding, [row["context"]] * row["batch"], row.get("shared", 0.0), row.get("trie_tokens"))


def _from_free(name: str, x: float) -> float:
    """A parameter from its unbounded coordinate: an efficiency (a share of the GPU's datasheet bandwidth or
    compute) stays in (0, 1) through a logistic, every other parameter stays positive through exp."""
    return 1 / (1 + math.exp(-x)) if name.endswith("_efficiency") else math.exp(x)


def _to_free(name: str, value: float) -> float:
    value = min(max(value, 1e-9), 1 - 1e-9) if name.endswith("_efficiency") else max(value, 1e-12)
    return math.log(value / (1 - value)) if name.endswith("_efficiency") else math.log(value)


def _jacobian(residuals, x: np.ndarray, r: np.ndarray, h: float = 1e-6) -> np.ndarray:
    columns = []
    for j in range(len(x)):
        step = np.zeros_like(x)
        step[j] = h
        columns.append((residuals(x + step) - r) / h)
    return np.array(columns).T


def _free_limits(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of each parameter's unbounded coordinate: its RUNTIME_BOUNDS (the fit never leaves a
    parameter's physically sensible range), within -40..40."""
    lower = [_to_free(n, RUNTIME_BOUNDS[n].low) if RUNTIME_BOUNDS[n].low > 0 else -40.0 for n in names]
    upper = [40.0 if n.endswith("_efficiency") else _to_free(n, RUNTIME_BOUNDS[n].high) for n in names]
    return np.clip(lower, -40, 40), np.clip(upper, -40, 40)


def least_squares(residuals, x0, iterations: int = 200, limits: tuple | None = None) -> np.ndarray:
    """Minimise sum(residuals(x)^2) from x0 (Levenberg-Marquardt with Marquardt's scaling; a coordinate the
    residuals do not depend on stays where it starts), each coordinate within ``limits`` (lower, upper; default
    -40..40). Stops when a step gains less than 1e-12 of the cost; with no coordinate, returns at once."""
    lower, upper = limits if limits is not None else (-40.0, 40.0)
    x = np.clip(np.array(x0, float), lower, upper)
    if x.size == 0:  # nothing to move (no measured shape depends on any parameter left free)
        return x
    r = residuals(x)
    cost, damping = float(r @ r), 1e-3
    for _ in range(iterations):
        jac = _jacobian(residuals, x, r)
        gradient, normal = jac.T @ r, jac.T @ jac
        scale = np.diag(np.diag(normal)) + 1e-12 * np.eye(len(x))
        while True:
            step = np.linalg.solve(normal + damping * scale, -gradient)
            trial = np.clip(x + step, lower, upper)
            r_trial = residuals(trial)
            if float(r_trial @ r_trial) < cost:
                gain = cost - float(r_trial @ r_trial)
                x, r, cost, damping = trial, r_trial, float(r_trial @ r_trial), max(damping / 3, 1e-12)
                break
            damping *= 4
            if damping > 1e12:
                return x
        if gain <= 1e-12 * max(cost, 1e-30) or cost < 1e-20:
            break
    return x


def _standard_errors(jac: np.ndarray, scatter: float) -> np.ndarray:
    """One standard error of each coordinate, scatter x sqrt(diag((J'J)^-1)) from J's singular values; infinite
    for a coordinate with a share in a direction the residuals do not see (a singular value below 1e-9 of the
    largest, or beyond the number of rows)."""
    _, values, vt = np.linalg.svd(jac, full_matrices=True)
    values = np.concatenate([values, np.zeros(len(vt) - len(values))])
    blind = values <= (values.max() if values.size else 0) * 1e-9
    inverse = np.where(blind, np.inf, 1 / np.where(blind, 1, values) ** 2)
    shares = vt**2
    contributions = np.where(shares > 1e-20, shares, 0.0) * np.where(shares > 1e-20, inverse[:, None], 0.0)
    return scatter * np.sqrt(contributions.sum(axis=0))


def _scatter(raw: np.ndarray, parameters: int) -> float:
    """The residuals' typical size (log): 1.4826 x their median absolute value (the standard deviation of normal
    errors, unmoved by a few shapes far off), scaled up for the degrees of freedom the fit took; at least
    NOISE_FLOOR."""
    dof = max(len(raw) - parameters, 1)
    return max(1.4826 * float(np.median(np.abs(raw))) * math.sqrt(len(raw) / dof), NOISE_FLOOR)


def _huber_weights(raw: np.ndarray, parameters: int, k: float = 2.0) -> np.ndarray:
    """Huber's weights: 1 for a residual within k scatters, k x scatter / |residual| beyond (a shape that a
    hiccup of the host made slow pulls the fit by k scatters, not by its whole error)."""
    limit = k * _scatter(raw, parameters)
    return np.minimum(1.0, limit / np.maximum(np.abs(raw), 1e-300))


@dataclass
class Fit:
    """A fitted runtime; ``identified``: the parameters the measurements pin within IDENTIFIED_WITHIN;
    ``not_identified``: the others, of which ``held`` (no measurement tells them apart from the rest) keep the
    prior's value and the rest keep the fit's, pinned less well; ``scatter``: the residuals' RMS (log)."""

    runtime: dict
    identified: list[str]
    not_identified: list[str]
    scatter: float
    held: list[str]


def fit_runtime(
    rows: list[dict], gpu: dict, model: dict, draft_model: dict | None, tp: int, fixed: dict | None = None
) -> Fit:
    """The runtime profile fitted to measured rows (each with ``seconds``): see the module's text. ``fixed``: the
    values of the parameters outside FITTED (default: the prior's). Long because its steps (fit, hold what no shape
    sees, hold what the shapes cannot tell apart) share the fit's state: the weights and the parameters held."""
    measured = [r for r in rows if r.get("seconds")]
    if not measured:
        raise CalibrationError("no shape was measured: nothing to fit (see the table's reasons)")
    start = {**prior(), **(fixed or {})}
    start.update({k: prior()[k] for k in FITTED})
    scatter = NOISE_FLOOR
    seconds = np.array([r["seconds"] for r in measured])

    def runtime_of(names, x) -> dict:
        return {**start, **{n: _from_free(n, v) for n, v in zip(names, x)}}

    weights = np.ones(len(measured))  # Huber's: a shape far off the others' fit counts less (see _reweigh)

    def residuals_for(names):
        def residuals(x):
            cost = CostModel(gpu, model, runtime_of(names, x), tp, draft_model)
            return np.sqrt(weights) * np.log(np.array([modelled_seconds(cost, r) for r in measured]) / seconds)

        return residuals

    def fit(names, x0) -> np.ndarray:
        """Least squares, reweighed until the weights settle (at most 4 times)."""
        x = np.asarray(x0, float)
        for _ in range(4):
            x = least_squares(residuals_for(names), x, limits=_free_limits(names))
            raw = residuals_for(names)(x) / np.sqrt(weights)
            new = _huber_weights(raw, len(names))
            if np.allclose(new, weights, atol=1e-3):
                break
            weights[:] = new
        return x

    free = list(FITTED)
    x = fit(free, [_to_free(n, start[n]) for n in free])
    # a parameter no measured shape depends on at the fit is held where the fit left it: at the prior when nothing
    # moved it, else where it drove it (a cost at nothing, whose log the shapes no longer see)
    residuals = residuals_for(free)
    sensitive = np.max(np.abs(_jacobian(residuals, x, residuals(x))), axis=0) > 1e-4
    start.update({n: _from_free(n, v) for n, v, keep in zip(FITTED, x, sensitive) if not keep})
    free, x = [n for n, keep in zip(FITTED, sensitive) if keep], x[sensitive]
    errors = np.array([])
    x = fit(free, x)
    while free:
        residuals = residuals_for(free)
        r = residuals(x)
        scatter = _scatter(r / np.sqrt(weights), len(free))
        jac = _jacobian(residuals, x, r)
        errors = _standard_errors(jac, scatter)
        if not np.isinf(errors).any():
            break
        # of the parameters the measurements cannot tell apart, the one they see least is held: at the prior when
        # the others then fit as well (its effect is theirs too), else where the fit put it (a cost it drove to
        # nothing, say, which the log scale no longer sees)
        blind = np.flatnonzero(np.isinf(errors))
        worst = int(blind[np.argmin(np.linalg.norm(jac[:, blind], axis=0))])
        keep = [i for i in range(len(free)) if i != worst]
        name, value = free[worst], _from_free(free[worst], x[worst])
        free = [free[i] for i in keep]
        x_prior = least_squares(residuals_for(free), x[keep], limits=_free_limits(free))
        r_prior = residuals_for(free)(x_prior)
        if float(r_prior @ r_prior) <= 1.1 * float(r @ r) + len(r) * NOISE_FLOOR**2:
            x = x_prior
        else:
            start[name] = value
            x = least_squares(residuals_for(free), x[keep], limits=_free_limits(free))
    identified = [n for n, e in zip(free, errors) if e <= IDENTIFIED_WITHIN]
    runtime = runtime_of(free, x)
    rounded = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in runtime.items()}
    return Fit(
        rounded, identified, [n for n in FITTED if n not in identified], scatter, [n for n in FITTED if n not in free]
    )
