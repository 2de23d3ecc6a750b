"""Configuration: type coercion, semantic checks, method expansion, server and cell tables.

Schema validation itself (JSON Schema draft 2020-12, defaults filled) is done
by the workflow with ``snakemake.utils.validate`` against config/schema.yaml;
this module does what a schema cannot: coerce ``--config`` strings to the
schema's types, reject duplicates and cross-key mistakes, expand method
sweeps, and derive the canonical parameters each job depends on.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from typing import Any

from . import ddtree


class ConfigError(ValueError):
    """A configuration mistake; the message names the key and what to do."""


# --------------------------------------------------------------------------
# Coercion of --config strings (Snakemake parses nested values as strings)
# --------------------------------------------------------------------------

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _coerce_scalar(value: Any, types: list[str]) -> Any:
    if not isinstance(value, str):
        if isinstance(value, int) and not isinstance(value, bool) and "integer" not in types and "number" in types:
            return float(value)
        return value
    if "string" in types:
        return value
    if "integer" in types and _INT.match(value):
        return int(value)
    if "number" in types and _FLOAT.match(value):
        return float(value)
    if "boolean" in types and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def coerce_to_schema(instance: Any, schema: dict, root: dict | None = None) -> Any:
    """Return a copy of ``instance`` with strings converted to the schema's scalar types.

    ``snakemake --config tp=[1,4]`` yields ``['1', '4']``; this turns it into
    ``[1, 4]`` so that validation and rerun triggers see the same values as
    a YAML file would give. Numbers where the schema wants a float become floats
    (``temperature: 0`` and ``0.0`` are the same setting).
    """
    root = root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref.startswith("#/"):
            node = root
            for part in ref[2:].split("/"):
                node = node[part]
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    for key in ("oneOf", "anyOf"):
        if key in schema:
            for option in schema[key]:
                candidate = coerce_to_schema(instance, option, root)
                if _matches_type(candidate, option):
                    return candidate
            return instance
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if "enum" in schema and not types:
        return instance
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for k, v in instance.items():
            sub = props.get(k, extra if isinstance(extra, dict) else None)
            out[k] = coerce_to_schema(v, sub, root) if sub else v
        return out
    if isinstance(instance, list):
        items = schema.get("items")
        return [coerce_to_schema(v, items, root) if items else v for v in instance]
    return _coerce_scalar(instance, types)


def _matches_type(value: Any, schema: dict) -> bool:
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    checks = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    return not types or any(checks[t](value) for t in types if t in checks)


# --------------------------------------------------------------------------
# Methods
# --------------------------------------------------------------------------

SPECULATIVE = ("dflash", "ddtree")


@dataclass(frozen=True)
class Method:
    """One decoding method as a server runs it: algorithm, parameters, flags, environment."""

    name: str
    algorithm: str
    params: dict  # block_size, budget, topk where they apply
    flags: tuple  # server flags (argument list), substituted; --attention-backend included when set
    env: dict  # environment variables, substituted
    attention_backend: str | None = None  # None: the server's own default (fa3 on Hopper for SGLang)
    min_free_slots_delay: str | int | None = None  # None: server.min_free_slots_delay

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "algorithm": self.algorithm,
            "params": dict(self.params),
            "flags": list(self.flags),
            "env": dict(self.env),
            "attention_backend": self.attention_backend,
            "min_free_slots_delay": self.min_free_slots_delay,
        }


def _substitute(template: str, values: dict, where: str) -> str:
    try:
        return template.format(**values)
    except KeyError as exc:
        raise ConfigError(
            f"{where}: placeholder {{{exc.args[0]}}} is not defined for this method; "
            f"known placeholders: {', '.join('{' + k + '}' for k in sorted(values))}"
        ) from None


def expand_methods(config: dict) -> list[Method]:
    """Expand the configured methods (sweeps over budget/topk) into concrete methods."""
    defaults = config.get("defaults", {})
    spellings = config["algorithms"]
    drafter = config["model"].get("drafter", "")
    methods: list[Method] = []
    for index, entry in enumerate(config["methods"]):
        algorithm = entry["algorithm"]
        where = f"methods[{index}] ({entry['name']})"
        if algorithm == "ar":
            for key in ("block_size", "budget", "topk", "tree_build"):
                if key in entry:
                    raise ConfigError(f"{where}: '{key}' has no meaning for algorithm 'ar'; remove it")
            grid = [{}]
        else:
            if algorithm == "dflash":
                for key in ("budget", "topk"):
                    if key in entry:
                        raise ConfigError(
                            f"{where}: '{key}' has no meaning for algorithm 'dflash' (a linear chain); "
                            "use algorithm 'ddtree' for a draft tree"
                        )
            block = entry.get("block_size", defaults.get("block_size", 16))
            axes: dict[str, list] = {"block_size": [block]}
            if algorithm != "ddtree" and "tree_build" in entry:
                raise ConfigError(f"{where}: 'tree_build' has no meaning for algorithm '{algorithm}'; remove it")
            if algorithm == "ddtree":
                try:
                    axes["tree_build"] = [ddtree.build(entry.get("tree_build")).name]
                except ValueError as exc:
                    raise ConfigError(f"{where}.tree_build: {exc}") from None
                if "budget" not in entry:
                    raise ConfigError(f"{where}: algorithm 'ddtree' needs 'budget' (an integer or a list to sweep)")
                for key, default in (("budget", None), ("topk", defaults.get("topk", 8))):
                    value = entry.get(key, default)
                    axes[key] = value if isinstance(value, list) else [value]
            grid = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
        swept = [k for k in ("budget", "topk") if isinstance(entry.get(k), list)]
        spelling = spellings.get(algorithm, {"flags": [], "env": {}})
        for params in grid:
            name = entry["name"] + "".join(f"-{k[0]}{params[k]}" for k in swept)
            values = {"drafter": drafter, **{k: str(v) for k, v in params.items()}}
            if "block_size" in params:
                values["draft_tokens"] = str(params["block_size"] - 1)
            mwhere = f"{where} algorithms.{algorithm}"
            flags = [_substitute(f, values, mwhere + ".flags") for f in spelling.get("flags", [])]
            flags += [_substitute(str(f), values, where + ".flags") for f in entry.get("flags", [])]
            if algorithm == "dflash" and config.get("match_ddtree_scheduling") and "--disable-overlap-schedule" not in flags:
                flags.append("--disable-overlap-schedule")
            backend = _attention_backend(config, entry, algorithm, params, flags, where)
            env = {k: _substitute(str(v), values, mwhere + ".env") for k, v in spelling.get("env", {}).items()}
            env.update({k: _substitute(str(v), values, where + ".env") for k, v in entry.get("env", {}).items()})
            methods.append(Method(name, algorithm, params, tuple(flags), env, backend,
                                  entry.get("min_free_slots_delay")))
    seen: dict[str, int] = {}
    for method in methods:
        if method.name in seen:
            raise ConfigError(
                f"methods: duplicated method name '{method.name}' (after expanding sweeps); "
                "give each method a unique name"
            )
        seen[method.name] = 1
    return methods


def _attention_backend(config: dict, entry: dict, algorithm: str, params: dict, flags: list, where: str) -> str | None:
    """The method's attention backend, appended to ``flags`` as --attention-backend when one is set.

    The method's own ``attention_backend`` (or an --attention-backend in its flags) wins; then, with
    ``match_ddtree_attention``, the DDTree spelling's backend for every method; then the algorithm's spelling;
    else None (the server's default). A DDTree tree budget (budget > block_size - 1) on another backend than
    its spelling requires is refused: the pull request's build does not start so.
    """
    spellings = config["algorithms"]
    if "--attention-backend" in flags:
        given = flags[flags.index("--attention-backend") + 1] if flags.index("--attention-backend") + 1 < len(flags) else None
        if entry.get("attention_backend") and entry["attention_backend"] != given:
            raise ConfigError(f"{where}: attention_backend '{entry['attention_backend']}' disagrees with "
                              f"--attention-backend {given} in its flags; keep one")
        backend = given
    else:
        backend = (entry.get("attention_backend")
                   or (spellings.get("ddtree", {}).get("attention_backend") if config.get("match_ddtree_attention") else None)
                   or spellings.get(algorithm, {}).get("attention_backend"))
        if backend:
            flags += ["--attention-backend", backend]
    required = spellings.get("ddtree", {}).get("attention_backend")
    if (algorithm == "ddtree" and required and backend != required
            and params.get("budget", 0) > params.get("block_size", 16) - 1):
        raise ConfigError(
            f"{where}: DDTree budget {params['budget']} builds a tree (budget > block_size - 1 = "
            f"{params['block_size'] - 1}), which this build verifies only with {required} attention "
            f"(algorithms.ddtree.attention_backend); remove attention_backend '{backend}' from the method")
    return backend


# --------------------------------------------------------------------------
# Normalisation and checks
# --------------------------------------------------------------------------


def normalise(config: dict) -> dict:
    """Check what the schema cannot and return a normalised deep copy.

    Call after schema validation (defaults filled). Raises ConfigError naming
    the key.
    """
    config = copy.deepcopy(config)
    names = [w["name"] for w in config["workloads"]]
    for index, w in enumerate(config["workloads"]):
        if w.get("source") == "file" and not w.get("path"):
            raise ConfigError(f"workloads[{index}] ({w['name']}): source 'file' needs 'path' (a prompt file)")
        if w.get("path") and w.get("source", "file") != "file":
            raise ConfigError(f"workloads[{index}] ({w['name']}): 'path' is only read with source: file")
        if w.get("path"):
            w["source"] = "file"
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"workloads: duplicated workload name '{name}'; give each workload a unique name")
    expand_methods(config)  # raises on duplicates and bad placeholders
    algorithms = {m["algorithm"] for m in config["methods"]}
    if config["backend"] == "sglang":
        if not config["model"].get("path"):
            raise ConfigError("model.path: required on the sglang backend (the target model's path or hub id)")
        if algorithms & set(SPECULATIVE) and not config["model"].get("drafter"):
            raise ConfigError(
                "model.drafter: required on the sglang backend when a dflash or ddtree method is configured"
            )
    config["adaptive"]["target"] = float(config["adaptive"]["target"])
    if config["adaptive"]["enabled"]:
        metric = config["adaptive"]["metric"]
        if metric != "output_throughput" and not re.match(r"^(ttft|tpot|itl|e2e|interactivity)\.(mean|p50|p90|p95|p99)$", metric):
            raise ConfigError(f"adaptive.metric: '{metric}' is not output_throughput or <metric>.<stat> "
                              "(metric: ttft, tpot, itl, e2e, interactivity; stat: mean, p50, p90, p95, p99)")
    if config["load"]["model"] == "poisson" and not config["load"].get("rate"):
        raise ConfigError("load.rate: required when load.model is poisson (sessions per second)")
    config["load"]["think_time"] = float(config["load"]["think_time"])
    if "rate" in config["load"]:
        config["load"]["rate"] = float(config["load"]["rate"])
    config["tp"] = sorted(config["tp"])
    config["concurrency"] = sorted(config["concurrency"])
    for key in ("temperature", "top_p"):
        config["sampling"][key] = float(config["sampling"][key])
    for key in ("startup_timeout", "request_timeout"):
        config["server"][key] = float(config["server"][key])
    config["server"]["env"] = {k: str(v) for k, v in config["server"]["env"].items()}
    if config["backend"] == "sim":
        check_sim_profiles(config)
    devices = config["gpu_pool"]["devices"]
    if devices and max(config["tp"]) > devices:
        raise ConfigError(f"tp: {max(config['tp'])} is larger than the {devices} GPUs available (gpu_pool.devices); "
                          "lower tp or use a larger host")
    for w in config["workloads"]:
        if w.get("concurrency"):
            w["concurrency"] = sorted(w["concurrency"])
    check_launch_flags(config)
    check_workload_files(config)
    check_cells_reach_label(config)
    return config


def check_sim_profiles(config: dict) -> None:
    """The simulated backend's gpu, model profile and runtime must exist (shipped or under sim.profiles)."""
    from .sim.model import profiles

    known = profiles(config["sim"]["profiles"])
    for key, kind in (("gpu", "gpus"), ("model_profile", "models"), ("runtime", "runtimes")):
        if config["sim"][key] not in known[kind]:
            raise ConfigError(f"sim.{key}: unknown profile '{config['sim'][key]}'; known: "
                              f"{', '.join(sorted(known[kind]))} (or define it under sim.profiles.{kind})")


def check_workload_files(config: dict) -> None:
    """Read every user prompt file now, so that bad data stops the run before any job (naming file and line)."""
    from .workloads import WorkloadError, build

    for w in config["workloads"]:
        if w.get("source") == "file":
            try:
                build(w, config["seed"], config["sampling"]["thinking"], config["model"].get("path"),
                      config["model"]["context_length"])
            except WorkloadError as exc:
                raise ConfigError(f"workloads ({w['name']}): {exc}") from None


def check_launch_flags(config: dict) -> None:
    """Parse every server's launch arguments with SGLang's recorded option table (plus declared extra flags)."""
    from .server import ServerError, server_arguments
    from .sglang_options import FlagError, check_argv

    table, extra = config["sglang"]["options_table"], config["sglang"]["extra_flags"]
    try:
        check_argv(list(config["server"]["flags"]), table, extra)
    except FlagError as exc:
        raise ConfigError(f"server.flags: {exc}") from None
    for server in servers(config):
        params = server_params(config, server["tp"], server["method"])
        try:
            check_argv(server_arguments(params, port=30000, max_context=32768), table, extra)
        except ServerError as exc:
            raise ConfigError(f"methods: method '{server['method']}': {exc}") from None
        except FlagError as exc:
            raise ConfigError(f"methods: method '{server['method']}': {exc}; fix its flags (or the "
                              f"algorithms spelling), or declare the flag in sglang.extra_flags") from None


# --------------------------------------------------------------------------
# Servers and cells
# --------------------------------------------------------------------------


def servers(config: dict) -> list[dict]:
    """One row per server job: (tp, method), and the repetition when cells are repeated.

    With repetitions, each repetition is its own server launch, so that the
    order of methods can be randomised per repetition (see method_order).
    """
    reps = range(config["repetitions"]) if config["repetitions"] > 1 else [None]
    return [{"tp": tp, "method": m.name, "repetition": r}
            for r in reps for tp in config["tp"] for m in expand_methods(config)]


def method_order(config: dict, tp: int, repetition: int) -> list[str]:
    """Order in which the methods of one (tp, repetition) run: shuffled by the seed, the same on every run."""
    import random

    names = [m.name for m in expand_methods(config)]
    random.Random(f"order:{config['seed']}:{tp}:{repetition}").shuffle(names)
    return names


def server_priority(config: dict, tp: int, method: str, repetition: int | None) -> int:
    """Snakemake priority of a server job: repetitions in order, methods in their shuffled order within one."""
    if repetition is None:
        return 0
    order = method_order(config, tp, repetition)
    return (config["repetitions"] - repetition) * 1000 + (len(order) - order.index(method))


def cell_path(tp, method, workload, concurrency, repetition=None, root: str = "results/cells") -> str:
    rep = "" if repetition is None else f"-r{repetition}"
    return f"{root}/tp{tp}/{method}/{workload}/c{concurrency}{rep}.json"


MIN_WAVES = 2  # a closed-loop cell needs this many sessions per slot to hold its concurrency after the first wave


def workload_concurrency(config: dict, workload: dict) -> list[int]:
    """The concurrency levels a workload is measured at: its own list, else the configuration's (both sorted by
    normalise)."""
    return workload.get("concurrency") or config["concurrency"]


def cell_requests(workload: dict, concurrency: int, load: dict) -> int:
    """Sessions a cell sends: the workload's ``requests`` when set, else max(load.min_requests, load.waves x
    concurrency), so that the concurrency is held for several waves of requests (a steady state) at every level."""
    if workload.get("requests"):
        return workload["requests"]
    return max(load["min_requests"], load["waves"] * concurrency)


def check_cells_reach_label(config: dict) -> None:
    """Every closed-loop cell can hold its concurrency: at least MIN_WAVES sessions per slot, no session replayed."""
    from .workloads import distinct_sessions

    for index, w in enumerate(config["workloads"]):
        available = distinct_sessions(w, config["model"]["context_length"])
        for c in workload_concurrency(config, w):
            n = cell_requests(w, c, config["load"])
            where = f"cell {w['name']} at concurrency {c} (workloads[{index}])"
            if available is not None and n > available:
                raise ConfigError(
                    f"{where}: needs {n} sessions but its source has {available} distinct ones that fit "
                    f"model.context_length; replaying a session inside a cell would hit the prefix cache. Lower its "
                    f"concurrency (workloads[{index}].concurrency), set workloads[{index}].requests to at most "
                    f"{available} (and at least {MIN_WAVES * c}), or use a source with more sessions")
            if config["load"]["model"] == "closed" and n < MIN_WAVES * c:
                raise ConfigError(
                    f"{where}: {n} sessions cannot hold {c} requests in flight after the first wave (at least "
                    f"{MIN_WAVES * c} needed); remove workloads[{index}].requests to size cells by concurrency "
                    f"(load.waves x concurrency), raise it to {MIN_WAVES * c}, or leave concurrency {c} out of "
                    f"workloads[{index}].concurrency")


def cells_of_server(config: dict, tp: int, method: str, repetition: int | None = None) -> list[dict]:
    """Every cell (workload, concurrency) one server job measures, in measurement order, with its session count."""
    return [
        {"tp": tp, "method": method, "workload": w["name"], "concurrency": c, "repetition": repetition or 0,
         "requests": cell_requests(w, c, config["load"]), "path": cell_path(tp, method, w["name"], c, repetition)}
        for w in config["workloads"] for c in workload_concurrency(config, w)
    ]


def all_cells(config: dict) -> list[dict]:
    return [cell for s in servers(config) for cell in cells_of_server(config, s["tp"], s["method"], s["repetition"])]


def server_params(config: dict, tp: int, method_name: str, repetition: int | None = None) -> dict:
    """Everything a bench job for one server depends on (and nothing else).

    This dict is passed to the job as canonical JSON through ``params:``, so a
    change in any of it reruns the job, and nothing outside it does.
    """
    method = next((m for m in expand_methods(config) if m.name == method_name), None)
    if method is None:
        raise ConfigError(f"no method named '{method_name}' in the configuration")
    return {
        "backend": config["backend"],
        "model": dict(config["model"]),
        "tp": tp,
        "method": method.as_dict(),
        "server": dict(config["server"]),
        "sim": dict(config["sim"]) if config["backend"] == "sim" else None,
        "sglang": (dict(config["sglang"]) if config["backend"] == "sglang" else
                   {k: config["sglang"][k] for k in ("options_table", "extra_flags")}),
        "gpu_pool": dict(config["gpu_pool"]),
        "workloads": [dict(w) for w in config["workloads"]],
        "concurrency": list(config["concurrency"]),
        "warmup": config["warmup"],
        "repetition": repetition,
        "seed": config["seed"],
        "sampling": dict(config["sampling"]),
        "load": dict(config["load"]),
        "adaptive": dict(config["adaptive"]) if config["adaptive"]["enabled"] else None,
        "cache_dir": config["cache_dir"],
    }
