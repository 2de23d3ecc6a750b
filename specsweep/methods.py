"""Methods: the configured methods expanded (sweeps over any listed parameter) into what a server runs.

Each method becomes a Method (specsweep.modelling.method): its algorithm (specsweep.algorithms), parameters,
drafter, server flags and environment, with the algorithm's spelling (the registry's, with config's ``algorithms``
overrides: DDTree lives in SGLang forks with differing flags) and placeholders substituted.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from . import algorithms, ddtree, engines
from .algorithms import AlgorithmError
from .canon import canonical_json
from .errors import ConfigError
from .modelling.acceptance import missing_acceptance
from .modelling.cost import cost_term_problems
from .modelling.method import Method
from .modelling.profiles import profiles


def _substitute(template: str, values: dict, where: str) -> str:
    try:
        return template.format(**values)
    except KeyError as exc:
        raise ConfigError(
            f"{where}: placeholder {{{exc.args[0]}}} is not defined for this method; "
            f"known placeholders: {', '.join('{' + k + '}' for k in sorted(values))}"
        ) from None


# What method expansion reads from a configuration; each distinct one is expanded once per process.
EXPANSION_KEYS = (
    "methods",
    "ddtree_builds",
    "defaults",
    "algorithms",
    "match_ddtree_scheduling",
    "match_ddtree_attention",
    "server",
    "backend",
    "engines",
)


def expand_methods(config: dict) -> list[Method]:
    """Expand the configured methods (sweeps over listed parameters) into concrete methods (once per distinct
    configuration: every server job, cell table and check asks again)."""
    try:  # the configuration's own DDTree builds, known to this process from here on
        defined = ddtree.define(config.get("ddtree_builds"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for name, build in defined.items():  # their own round costs, as the cost model's parameters
        problems = cost_term_problems(build.cost_terms())
        if problems:
            raise ConfigError(f"ddtree_builds.{name}.costs.{problems[0]} (specsweep/modelling/cost.py RUNTIME_BOUNDS)")
    key = canonical_json({**{k: config.get(k) for k in EXPANSION_KEYS}, "drafter": config["model"].get("drafter", "")})
    if key not in _EXPANDED:
        _EXPANDED[key] = tuple(_on_engines(config))
    return list(_EXPANDED[key])


def _on_engines(config: dict) -> list[Method]:
    """Every method, and with ``engines`` every method on each engine it runs on, named <method>@<engine>."""
    if not engines.names(config):
        named = [f"methods[{i}] ({e['name']})" for i, e in enumerate(config["methods"]) if e.get("engines")]
        if named:
            raise ConfigError(f"{named[0]}.engines: no engines are configured (engines); define them or remove it")
        return _expand(config)
    for index, entry in enumerate(config["methods"]):
        unknown = sorted(set(entry.get("engines") or []) - set(engines.names(config)))
        if unknown:
            raise ConfigError(
                f"methods[{index}] ({entry['name']}).engines: {', '.join(unknown)} is not an engine "
                f"(engines: {', '.join(engines.names(config))})"
            )
    out = []
    for engine in engines.names(config):
        view = engines.view(config, engine)
        if view["methods"]:
            out += [replace(m, name=engines.qualified(m.name, engine), engine=engine) for m in _expand(view)]
    return out


_EXPANDED: dict[str, tuple[Method, ...]] = {}


UNCAPPED = "uncapped"  # a cap left to the server's build (DDTree's topk: SGLANG_DDTREE_MAX_TOPK not set, its max_topk)


def _grid(algorithm: algorithms.Algorithm, entry: dict, defaults: dict, where: str) -> tuple[list[dict], list, set]:
    """(every combination of the method's parameter values, the swept parameters, the parameters the configuration
    sets): its own value, else ``defaults.<algorithm>``, else a flat ``defaults`` key of old where the parameter takes
    one (``flat_default``: DFlash's and DDTree's block, DDTree's width cap), else the registry's; a list sweeps a
    parameter that has a sweep tag. Every parameter of every algorithm can be set under defaults.<algorithm>."""
    axes, swept, given = {}, [], set()
    own = defaults.get(algorithm.name) or {}
    for p in algorithm.parameters:
        flat = defaults.get(p.name) if p.flat_default else None
        for value in (entry.get(p.name), own.get(p.name), flat):
            if value is not None:
                given.add(p.name)
                break
        else:
            value = p.default
        if value is None:
            if p.required:
                raise ConfigError(
                    f"{where}: algorithm '{algorithm.name}' needs '{p.name}'"
                    + (" (an integer or a list to sweep)" if p.sweep_tag else "")
                )
            continue
        if isinstance(value, list):
            if not p.sweep_tag:
                raise ConfigError(
                    f"{where}: '{p.name}' cannot be swept (one value per method); list the methods one by one"
                )
            swept.append(p)
        axes[p.name] = value if isinstance(value, list) else [value]
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())], swept, given


def _unspelled(algorithm: algorithms.Algorithm, spelling: dict, given: set, where: str) -> dict:
    """The parameters the spelling in use does not pass to the server: set by the configuration, an error (the
    server would never see it); else what the server runs without it (None: the server's own choice)."""
    carried = algorithm.spelled(spelling)
    missing = [p for p in algorithm.parameters if p.spelled and p.name not in carried]
    for p in missing:
        if p.name in given:
            raise ConfigError(
                f"{where}: '{p.name}' is set, but the spelling of algorithm '{algorithm.name}' "
                f"(algorithms.{algorithm.name}) passes no {{{p.name}}} to the server; add it to the "
                "spelling's flags or env, or remove it from the method"
            )
    return {p.name: algorithm.server_default(p) for p in missing}


def _drafter(algorithm: algorithms.Algorithm, entry: dict, config: dict, where: str) -> tuple[str | None, str]:
    """(the method's own drafter, the {drafter} placeholder's value): a method of an algorithm without a drafter, or
    whose drafter is the target's own head, may not name one; one with its own must; DFlash and DDTree fall back to
    model.drafter."""
    own, shared = entry.get("drafter"), config["model"].get("drafter") or ""
    if not algorithm.drafter_path:
        if own:
            whose = f"drafts with {algorithm.drafter_doc}" if algorithm.drafter == "target" else "has no drafter"
            raise ConfigError(f"{where}: algorithm '{algorithm.name}' {whose}; remove 'drafter' from the method")
        return None, ""
    if algorithm.drafter == "own" and not own:
        raise ConfigError(
            f"{where}: algorithm '{algorithm.name}' needs its own draft model: set 'drafter' "
            f"(the path or hub id of its {algorithm.title} drafter) on the method"
        )
    if algorithm.drafter == "shared" and not (own or shared):
        raise ConfigError(
            f"model.drafter: required for method '{entry['name']}' (algorithm '{algorithm.name}'); set "
            "model.drafter (the DFlash drafter) or the method's own 'drafter'"
        )
    return own or None, own or shared


def _expand(config: dict) -> list[Method]:
    """Every configured method's concrete methods (``_expand_entry``), in order, their names unique; on the simulated
    backend one drafter per algorithm (``_one_drafter_per_algorithm``)."""
    methods: list[Method] = []
    for index, entry in enumerate(config["methods"]):
        methods += _expand_entry(config, entry, f"methods[{index}] ({entry['name']})")
    if config.get("backend") == "sim":
        _one_drafter_per_algorithm(methods, config)
    seen: dict[str, int] = {}
    for method in methods:
        if method.name in seen:
            raise ConfigError(
                f"methods: duplicated method name '{method.name}' (after expanding sweeps); "
                "give each method a unique name"
            )
        seen[method.name] = 1
    return methods


def _expand_entry(config: dict, entry: dict, where: str) -> list[Method]:
    """One configured method (``where`` names it) as the methods of its sweep's grid, each named after the values
    it sweeps. Refuses (ConfigError naming the key) an unknown algorithm, a parameter the algorithm does not have, a
    flag the algorithm's spelling sets from a parameter."""
    try:
        algorithm = algorithms.get(entry["algorithm"])
    except AlgorithmError as exc:
        raise ConfigError(f"{where}.algorithm: {exc}") from None
    why = missing_acceptance(algorithm, profiles((config.get("sim") or {}).get("profiles")))
    if why:  # the plan prices every method with the acceptance model, on either backend
        raise ConfigError(f"{where}.algorithm: '{algorithm.name}': {why}")
    for key in algorithms.PARAMETER_NAMES:
        if key in entry and key not in {p.name for p in algorithm.parameters}:
            raise ConfigError(
                f"{where}: '{key}' has no meaning for algorithm '{algorithm.name}'; remove it (algorithms with it: "
                f"{', '.join(algorithms.with_parameter(key))})"
            )
    drafter, drafter_value = _drafter(algorithm, entry, config, where)
    spelling = algorithms.spelling(algorithm.name, config.get("algorithms"))
    grid, swept, given = _grid(algorithm, entry, config.get("defaults", {}), where)
    server_flags = list(config.get("server", {}).get("flags", []))
    taken = algorithm.flags_set(spelling) & {f.split("=")[0] for f in list(entry.get("flags", [])) + server_flags}
    if taken:
        raise ConfigError(
            f"{where}: {', '.join(sorted(taken))} in flags (the method's or server.flags) is set "
            f"by the spelling of algorithm '{algorithm.name}' from its parameters; set the "
            "parameter instead, or change the spelling (algorithms)"
        )
    out = []
    for raw in grid:
        params, unset = _resolved(algorithm, spelling, raw, given, where)
        name = entry["name"] + "".join(
            f"-{p.sweep_tag}{raw[p.name]:g}" if isinstance(raw[p.name], float) else f"-{p.sweep_tag}{raw[p.name]}"
            for p in swept
        )
        flags, env, backend = _spelled(config, entry, where, algorithm, spelling, params, unset, drafter_value)
        out.append(
            Method(name, algorithm.name, params, tuple(flags), env, backend, entry.get("min_free_slots_delay"), drafter)
        )
    return out


def _resolved(algorithm: algorithms.Algorithm, spelling: dict, raw: dict, given, where: str) -> tuple[dict, set]:
    """(the parameters of one point of a sweep as the server runs them, those it leaves unset): "uncapped" (a cap
    the server's build then holds, DDTree's topk) is not passed, its placeholders drop their env."""
    unset = {k for k, v in raw.items() if v == UNCAPPED}
    for name in sorted(k for k in unset if not algorithm.parameter(k).uncapped):
        owners = [
            a.title for a in algorithms.REGISTRY.values() if any(p.name == name and p.uncapped for p in a.parameters)
        ]
        raise ConfigError(
            f"{where}.{name}: '{UNCAPPED}' is {' and '.join(owners) or 'no algorithm'}'s (its build's own cap); "
            f"give algorithm '{algorithm.name}' a number"
        )
    try:
        params = algorithm.resolve(
            {**{k: v for k, v in raw.items() if k not in unset}, **_unspelled(algorithm, spelling, given, where)}
        )
    except AlgorithmError as exc:
        raise ConfigError(_located(where, exc)) from None
    return params, unset


def _spelled(
    config: dict,
    entry: dict,
    where: str,
    algorithm: algorithms.Algorithm,
    spelling: dict,
    params: dict,
    unset: set,
    drafter_value: str,
) -> tuple[list[str], dict, str | None]:
    """(flags, environment, attention backend) of a method with these parameters: the algorithm's spelling and the
    method's own flags and env, placeholders substituted; the overlap scheduler off where DDTree's scheduling is
    matched; the attention backend as the server's flags (last on the command line) leave it. Refuses (ConfigError)
    what the algorithm's check or its DDTree build's environment refuses."""
    values = {"drafter": drafter_value, **{k: str(v) for k, v in params.items() if v is not None}}
    if "block_size" in params:
        values["draft_tokens"] = str(params["block_size"] - 1)
    server_flags = list(config.get("server", {}).get("flags", []))
    mwhere = f"{where} algorithms.{algorithm.name}"
    flags = [_substitute(f, values, mwhere + ".flags") for f in spelling["flags"]]
    flags += [_substitute(str(f), values, where + ".flags") for f in entry.get("flags", [])]
    if (
        config.get("match_ddtree_scheduling")
        and algorithm.speculative
        and algorithm.overlap
        and "--disable-overlap-schedule" not in flags
    ):
        flags.append("--disable-overlap-schedule")
    backend = _attention_backend(config, entry, flags, where)
    # the server's flags come last on the command line: what they set is what runs
    backend = algorithms.flag_value(flags + server_flags, "--attention-backend") or backend
    # a variable of a parameter the method leaves unset ("uncapped", or an optional one such as accept_length) is not
    # set at all: the server's own choice holds
    absent = unset | {p.name for p in algorithm.parameters if params.get(p.name) is None}
    env = {
        k: _substitute(str(v), values, mwhere + ".env")
        for k, v in spelling["env"].items()
        if not any("{" + u + "}" in str(v) for u in absent)
    }
    env.update({k: _substitute(str(v), values, where + ".env") for k, v in entry.get("env", {}).items()})
    try:
        algorithm.check(params, flags + server_flags, backend, spelling)
        algorithm.check_environment(params, env)  # e.g. a DDTree build's tuning read from the method's environment
    except AlgorithmError as exc:
        raise ConfigError(_located(where, exc)) from None
    return flags, env, backend


def _one_drafter_per_algorithm(methods: list[Method], config: dict) -> None:
    """The simulated backend models one drafter per algorithm (its profile in sim_profiles.yaml ``drafters``, and
    DFlash's model.drafter): methods that name different drafters of one algorithm would be simulated alike."""
    drafters: dict[str, set] = {}
    for m in methods:
        if m.spec.drafter_path:
            drafters.setdefault(m.algorithm, set()).add(m.drafter or config["model"].get("drafter"))
    for algorithm, names in drafters.items():
        if len(names) > 1:
            raise ConfigError(
                f"methods: the {algorithm} methods name {len(names)} drafters ({', '.join(sorted(names))}), "
                "but the simulated backend models one drafter per algorithm and would simulate them "
                "alike; give them one drafter, or compare drafters on the sglang backend"
            )


def _located(where: str, exc: AlgorithmError) -> str:
    return f"{where}.{exc.key}: {exc}" if exc.key else f"{where}: {exc}"


def _attention_backend(config: dict, entry: dict, flags: list, where: str) -> str | None:
    """The method's attention backend, appended to ``flags`` as --attention-backend when one is set.

    The method's own ``attention_backend`` (or an --attention-backend in its flags) wins; then, with
    ``match_ddtree_attention``, the DDTree spelling's backend for every method; then the algorithm's spelling;
    else None (the server's default). Whether the algorithm runs on it is the algorithm's check.
    """
    given = algorithms.flag_value(flags, "--attention-backend")
    if given is not None:
        if entry.get("attention_backend") and entry["attention_backend"] != given:
            raise ConfigError(
                f"{where}: attention_backend '{entry['attention_backend']}' disagrees with "
                f"--attention-backend {given} in its flags; keep one"
            )
        return given
    overrides = config.get("algorithms")
    backend = (
        entry.get("attention_backend")
        or (
            algorithms.spelling(algorithms.DDTREE.name, overrides)["attention_backend"]
            if config.get("match_ddtree_attention")
            else None
        )
        or algorithms.spelling(entry["algorithm"], overrides)["attention_backend"]
    )
    if backend:
        flags += ["--attention-backend", backend]
    return backend
