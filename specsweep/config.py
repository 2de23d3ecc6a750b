"""Configuration checks: what the schema cannot say, each mistake named by its key.

The workflow first reads each configuration file again with ``read_config_file`` (a duplicated key refused) and
walks the merged configuration with ``check_values`` (its size, non-finite numbers, NUL characters); then schema
validation (JSON Schema draft 2020-12, defaults filled) is done with ``snakemake.utils.validate`` against
config/schema.yaml, after ``coerce.coerce_to_schema`` and ``with_engine_sims`` (each engine's ``sim`` block merged
over the top-level one), its error cut to the key and the reason by ``schema_error``;
``normalise`` then rejects duplicates and cross-key mistakes and returns the normalised configuration every rule
uses (methods are expanded by ``methods``, server jobs and cells listed by ``jobs``). Every mistake is a
``ConfigError`` (defined in ``errors``, where the modules these checks call find it too).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path

import yaml

from .algorithms import AR
from .engines import merged
from .engines import names as engine_names
from .engines import split as engine_split
from .engines import view as engine_view
from .errors import ConfigError, DuplicateKey, did_you_mean, unique_pairs
from .layout import MAX_EXPANDED_NAME
from .jobs import MIN_WAVES, cell_requests, gpu_pool, server_job, servers, simulated_gpus, workload_concurrency
from .launcher import ServerError, server_arguments
from .methods import expand_methods
from .sglang_options import FlagError, check_argv, decoding_variable
from .modelling.acceptance import ACCEPTANCE
from .modelling.profiles import AUTO, ProfileError, auto_runtime, profiles
from .traces import TRACE_FORMATS
from .workloads import WorkloadError, build, distinct_sessions, trace_account

MAX_VALUES = 100_000  # values in one configuration; a YAML anchor can make millions of a few lines
MAX_SESSIONS = 10_000  # sessions one cell may send (load.min_requests, load.waves x concurrency, requests)


def key_path(parts) -> str:
    """A key as a user writes it: workloads[0].requests."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the configuration"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}  # key: the line it was first given at
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the safe loader refuses it itself
                continue
            if first is not None:
                raise ConfigError(
                    f"{self.name}: line {line}: duplicated key '{key}' (first given at line {first}); "
                    "keep one of them (YAML would keep the last silently)"
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


def read_config_file(path: str | Path):
    """A configuration file's content (JSON or YAML, as Snakemake reads it), refusing a duplicated key by file, key
    (and line, in YAML): Snakemake's loader keeps the last one silently."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text, object_pairs_hook=unique_pairs)
    except DuplicateKey as exc:
        raise ConfigError(
            f"{path}: duplicated key '{exc.args[0]}'; keep one of them (JSON would keep the last silently)"
        ) from None
    except json.JSONDecodeError:
        pass
    loader = _UniqueKeyLoader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def check_budget(config: dict) -> None:
    """``budget: verdict`` stops each speculative cell against AR's: it needs an AR method, one launch per server and
    no adaptive cells (both stop a cell; one rule at a time)."""
    stopping = config.get("verdict_stopping") or {}
    stopping.update({k: float(stopping[k]) for k in ("equivalence", "level") if k in stopping})
    if config.get("budget", "exhaustive") != "verdict":
        return
    if config["adaptive"]["enabled"]:
        raise ConfigError(
            "budget: verdict and adaptive.enabled both stop a cell early: set one of them (budget: exhaustive, or "
            "adaptive.enabled: false)"
        )
    load = config["load"]
    if load["model"] != "closed" or float(load["think_time"]):
        raise ConfigError(
            "budget: verdict prices each look's sessions by their time in a closed loop at full concurrency: it needs "
            f"load.model: closed and load.think_time: 0 (given {load['model']}, {load['think_time']}); set them, or "
            "budget: exhaustive"
        )
    if config["repetitions"] > 1:
        raise ConfigError(
            f"budget: verdict stops each cell against AR's within one launch; repetitions: {config['repetitions']} "
            "is not supported with it: set repetitions: 1 or budget: exhaustive"
        )


def check_values(config) -> None:
    """Refuse what a schema cannot see, before anything copies or prints the configuration: more than MAX_VALUES
    values (a YAML anchor expanded into copies), numbers that are not finite (NaN, infinity: every number the
    workflow uses must be a real one) and NUL characters (no path, flag or environment variable can hold one).
    The walk stops at the limit, so it is quick whatever the anchors expand to. Each refusal names the key."""
    count = 0
    stack: list[tuple[tuple, object]] = [((), config)]  # (key path, value) still to walk
    while stack:
        parts, value = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(
                f"{key_path(parts[:1])}: the configuration holds more than {MAX_VALUES} values (here "
                f"at {key_path(parts)}); a YAML anchor repeated inside itself expands into copies. "
                "Write the values out"
            )
        if isinstance(value, dict):
            for k, v in value.items():
                if "\0" in str(k):
                    raise ConfigError(f"{key_path(parts)}: the key {str(k)!r} holds a NUL character; remove it")
                stack.append((parts + (k,), v))
        elif isinstance(value, list):
            stack.extend((parts + (i,), v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"{key_path(parts)}: {value} is not a finite number; give a number (NaN and infinity mean nothing here)"
            )
        elif isinstance(value, str) and "\0" in value:
            raise ConfigError(
                f"{key_path(parts)}: the value holds a NUL character (\\0), which no path, flag or "
                "environment variable can carry; remove it"
            )


def schema_error(error) -> str:
    """A schema validation error (jsonschema.ValidationError) as its key and the reason, cut short: never the
    instance or the schema printed whole. Where a value matches none of a key's forms (oneOf: an integer or a
    list), the reason is that of the form it came closest to: a bound it broke, or the list item that is wrong."""
    while error.validator in ("oneOf", "anyOf"):
        closer = [
            e
            for e in error.context
            if len(e.absolute_path) > len(error.absolute_path) or e.validator not in ("type", "enum")
        ]
        if not closer:
            break
        error = max(closer, key=lambda e: len(e.absolute_path))
    if (
        error.validator == "additionalProperties"
        and error.validator_value is False
        and isinstance(error.instance, dict)
    ):
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(str(k) for k in error.instance if k not in known)
        if unknown:
            where, key = key_path(error.absolute_path), key_path([*error.absolute_path, unknown[0]])
            return f"{key}: not a key of {where}; known: {', '.join(known)}{did_you_mean(unknown[0], known)}"
    reason = error.message if len(error.message) <= 300 else error.message[:300] + " ..."
    return f"{key_path(error.absolute_path)}: {reason}"


def warnings(config: dict) -> list[str]:
    """What a valid (normalised) configuration will not give, each said once when the workflow starts: without an
    AR method (algorithm ar) on an engine, that engine's cells have no baseline, so their speedups over AR (and the
    losslessness check, the break-even concurrencies and the report's speedup charts built on them) are missing."""
    methods = expand_methods(config)
    builds: list[str | None] = [*engine_names(config)] or [None]  # None: the one engine of the top-level blocks
    missing = [engine for engine in builds if not any(m.algorithm == AR.name and m.engine == engine for m in methods)]
    if not missing:
        return []
    where = "" if missing == [None] else f"on engine{'s' * (len(missing) > 1)} {', '.join(map(str, missing))}, "
    return [
        f"{where}no method runs AR (algorithm: ar), the baseline every speedup is measured against: the speedup "
        "columns of results/summary.csv, the losslessness check, the break-even table and the report's speedup "
        "charts will be empty. Add one under methods, e.g. `- {name: ar, algorithm: ar}`"
    ]


def with_engine_sims(config: dict) -> dict:
    """Before schema validation: the configuration with every engine's ``sim`` block merged over the top-level one
    key by key at every depth (engines.merged; an engine without one gets the top-level block), so that the schema,
    which checks an engine's block as it checks the top-level one, sees the whole block that engine's servers run
    (an error naming engines[i].sim.<key>) and fills in only the defaults neither block gives. A value that is not
    a mapping is left as it is, for the schema to refuse."""
    top, given = config.get("sim", {}), config.get("engines")
    if not isinstance(top, dict) or not isinstance(given, list):
        return config
    return {
        **config,
        "engines": [{**e, "sim": merged(top, e.get("sim", {}))} if isinstance(e, dict) else e for e in given],
    }


def normalise(config: dict) -> dict:
    """Check what the schema cannot and return a normalised deep copy.

    Call after schema validation (defaults filled). Raises ConfigError naming
    the key.
    """
    config = copy.deepcopy(config)
    check_workloads(config)
    check_folders(config)
    if config["backend"] == "sglang" and not config["model"].get("path"):
        raise ConfigError("model.path: required on the sglang backend (the target model's path or hub id)")
    check_model_profiles(config)
    resolve_auto_runtime(config)
    check_acceptance(config)
    if config["backend"] == "sim":
        check_sim_profiles(config)
    check_engines(config)
    expand_methods(config)  # raises on parameters, drafters and spellings a method's algorithm refuses
    check_external(config)
    check_expanded_names(config)
    check_pass_env(config)
    check_slo(config)
    config["slo"]["attainment"] = float(config["slo"]["attainment"])
    for objective in config["slo"]["objectives"]:  # one spelling of a number, given or the default's
        objective.update({k: float(v) for k, v in objective.items() if k.endswith("_ms")})
    check_adaptive(config)
    check_budget(config)
    if config["load"]["model"] == "poisson" and not config["load"].get("rate"):
        raise ConfigError("load.rate: required when load.model is poisson (sessions per second)")
    config["load"]["think_time"] = float(config["load"]["think_time"])
    if "rate" in config["load"]:
        config["load"]["rate"] = float(config["load"]["rate"])
    config["tp"] = sorted(config["tp"])
    config["concurrency"] = sorted(config["concurrency"])
    for key in ("temperature", "top_p"):
        config["sampling"][key] = float(config["sampling"][key])
    for key in ("startup_timeout", "request_timeout", "orphan_timeout"):
        config["server"][key] = float(config["server"][key])
    config["server"]["env"] = {k: str(v) for k, v in config["server"]["env"].items()}
    devices = gpu_pool(config)["devices"]
    if devices and max(config["tp"]) > devices:
        key = "sim.gpus, the simulated host's" if simulated_gpus(config) else "gpu_pool.devices"
        raise ConfigError(
            f"tp: {max(config['tp'])} is larger than the {devices} GPUs available ({key}); "
            "lower tp or use a larger host"
        )
    for w in config["workloads"]:
        if w.get("concurrency"):
            w["concurrency"] = sorted(w["concurrency"])
    check_launch_flags(config)
    check_workload_files(config)
    check_cells_reach_label(config)
    return config


def check_adaptive(config: dict) -> None:
    """adaptive: its target as a float; stopping refused on a trace workload (its window is replayed as traced) and a
    metric that is not output_throughput or <metric>.<stat>."""
    config["adaptive"]["target"] = float(config["adaptive"]["target"])
    if config["adaptive"]["enabled"]:
        traced = [w["name"] for w in config["workloads"] if w.get("source") == "trace"]
        if traced:
            raise ConfigError(
                f"adaptive.enabled: workload '{traced[0]}' replays a trace (its window's requests at their traced "
                "times), which no stopping rule may cut short or extend; set adaptive.enabled: false or measure the "
                "trace in a configuration of its own"
            )
        metric = config["adaptive"]["metric"]
        if metric != "output_throughput" and not re.match(
            r"^(ttft|tpot|itl|e2e|interactivity)\.(mean|p50|p90|p95|p99)$", metric
        ):
            raise ConfigError(
                f"adaptive.metric: '{metric}' is not output_throughput or <metric>.<stat> "
                "(metric: ttft, tpot, itl, e2e, interactivity; stat: mean, p50, p90, p95, p99)"
            )


def check_workloads(config: dict) -> None:
    """Each workload's source and path agree (a path makes it a file's), its max_new_tokens leaves room for a prompt
    in the model's context, and its name is its own; a workload with a path gets ``source: file``."""
    names = [w["name"] for w in config["workloads"]]
    for index, w in enumerate(config["workloads"]):
        if w.get("source") in ("file", "trace") and not w.get("path"):
            raise ConfigError(
                f"workloads[{index}] ({w['name']}): source '{w['source']}' needs 'path' (a prompt file or a trace)"
            )
        if w.get("path") and w.get("source", "file") not in ("file", "trace"):
            raise ConfigError(f"workloads[{index}] ({w['name']}): 'path' is only read with source: file or trace")
        if w.get("path"):
            w["source"] = w.get("source", "file")
        check_trace(w, index, config["model"]["context_length"])
        if w["max_new_tokens"] >= config["model"]["context_length"]:
            raise ConfigError(
                f"workloads[{index}] ({w['name']}).max_new_tokens: {w['max_new_tokens']} leaves no room "
                f"for a prompt in model.context_length {config['model']['context_length']}; lower it "
                "(or raise model.context_length to the model's)"
            )
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"workloads: duplicated workload name '{name}'; give each workload a unique name")


TRACE_KEYS = ("window", "time_scale", "over_context")


def check_trace(w: dict, index: int, context_length: int) -> None:
    """A trace workload's file reads (a malformed line refused naming it) and its window holds a request; its cells
    send the window's requests (at most ``requests``); a workload of another source sets no trace key and no trace
    format."""
    where = f"workloads[{index}] ({w['name']})"
    if w.get("source") != "trace":
        defaults = {"time_scale": 1, "over_context": "clip"}  # the schema's, filled in every workload
        given = [k for k in TRACE_KEYS if k in w and w[k] != defaults.get(k)]
        if given or w.get("format") in TRACE_FORMATS:
            raise ConfigError(f"{where}.{given[0] if given else 'format'}: only a trace has it (source: trace)")
        w.pop("time_scale", None), w.pop("over_context", None)
        w.setdefault("format", "jsonl")
        return
    if w.get("format") not in (None, *TRACE_FORMATS):
        raise ConfigError(f"{where}.format: a trace is mooncake or azure, not {w['format']}")
    window = w.get("window") or {}
    if {"start_s", "duration_s"} & set(window) and {"first_line", "last_line"} & set(window):
        raise ConfigError(f"{where}.window: give seconds (start_s, duration_s) or lines (first_line, last_line)")
    if window.get("first_line", 1) > window.get("last_line", 10**12):
        raise ConfigError(f"{where}.window: first_line {window['first_line']} is after last_line {window['last_line']}")
    try:
        available = trace_account(w, context_length)["requests"]
    except WorkloadError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if w.get("requests", 0) > available:
        raise ConfigError(
            f"{where}.requests: {w['requests']}, but its trace window holds {available} requests that fit the context; "
            "lower requests or widen the window"
        )
    w["requests"] = w.get("requests") or available
    if w["requests"] > MAX_SESSIONS:
        raise ConfigError(
            f"{where}: its trace window holds {available} requests that fit the context, more than the {MAX_SESSIONS} "
            "a cell may send; narrow workloads[].window (duration_s, or first_line and last_line) or set "
            f"workloads[].requests to at most {MAX_SESSIONS}"
        )


def check_folders(config: dict) -> None:
    """The folders the workflow writes into are folders of their own. None is empty (its files would start at the
    filesystem root: '' + '/journal/...') or the filesystem root; the cell cache, which spreads its entries,
    journals and plans over its folder, is neither the working folder nor one above it. Shared storage elsewhere
    is fine."""
    here = os.path.realpath(".")
    for key, folder in (
        ("cache_dir", config["cache_dir"]),
        ("gpu_pool.lock_dir", config["gpu_pool"].get("lock_dir")),
        ("sglang.env_dir", config["sglang"].get("env_dir")),
    ):
        if folder is None:
            continue
        if not folder.strip():
            raise ConfigError(
                f"{key}: empty; give a folder of its own (files would be written from the filesystem "
                "root on), or leave the key out for its default"
            )
        real = os.path.realpath(folder)
        if os.path.dirname(real) == real:
            raise ConfigError(f"{key}: '{folder}' is the filesystem root; give a folder of its own")
        if key == "cache_dir" and (here == real or here.startswith(real.rstrip(os.sep) + os.sep)):
            raise ConfigError(
                f"cache_dir: '{folder}' is the working folder or one above it, where the cache's entries "
                "would mix with other files; give a folder of its own (default results/cache)"
            )


def check_expanded_names(config: dict) -> None:
    """Every method's expanded name (its sweep tags and @<engine> added), which names its folders and files, is at
    most layout.MAX_EXPANDED_NAME characters; refused naming the method's key (and its engine's)."""
    for method in expand_methods(config):
        if len(method.name) <= MAX_EXPANDED_NAME:
            continue
        base = engine_split(method.name)[0]
        index = max(
            (i for i, e in enumerate(config["methods"]) if base == e["name"] or base.startswith(e["name"] + "-")),
            key=lambda i: len(config["methods"][i]["name"]),
        )
        keys = f"methods[{index}].name" + (
            f" or engines[{engine_names(config).index(method.engine)}].name" if method.engine else ""
        )
        raise ConfigError(
            f"methods[{index}] ({config['methods'][index]['name']}): its server's name '{method.name}' "
            f"({len(method.name)} characters, its sweep tags{' and engine' if method.engine else ''} included) is "
            f"longer than the {MAX_EXPANDED_NAME} a name that becomes a folder and file names may have; shorten "
            f"{keys}"
        )


def check_external(config: dict) -> None:
    """backend external: every method names its server (methods[].url), is one server (no sweep, no engines) at the
    one TP size it runs at (one tp), and nothing starts a server (no calibration in the default target); on the
    other backends a method names no URL."""
    external = config["backend"] == "external"
    for index, entry in enumerate(config["methods"]):
        where = f"methods[{index}] ({entry['name']})"
        if not external:
            for key in ("url", "api_key_env"):
                if key in entry:
                    raise ConfigError(
                        f"{where}.{key}: only backend external reaches servers at a URL (backend is "
                        f"{config['backend']}, which starts its own); remove it or set backend: external"
                    )
            continue
        if not entry.get("url"):
            raise ConfigError(
                f"{where}.url: required on backend external (the base URL of the server that runs this method, "
                "e.g. http://10.0.0.5:30000)"
            )
        if "@" in entry["url"]:  # user:password@host: a secret in the configuration, its cells and logs
            raise ConfigError(
                f"{where}.url: holds credentials (user@ or user:password@); a URL is written into plans, cells and "
                "logs: give the bare http://host:port and the key in the variable api_key_env names"
            )
    if not external:
        return
    if engine_names(config):
        raise ConfigError("engines: backend external compares the servers the methods name; remove engines")
    expanded = [m.name for m in expand_methods(config)]
    swept = [e["name"] for e in config["methods"] if e["name"] not in expanded]
    if swept:
        raise ConfigError(
            f"methods ({swept[0]}): a sweep needs one server per value, and backend external has one URL per method; "
            "list one method per server, each with one value and its own url"
        )
    if len(config["tp"]) != 1:
        raise ConfigError(
            f"tp: {config['tp']}: backend external measures each method's server at the TP size it runs at; list "
            "that one size (each /server_info is checked against it)"
        )
    if config["calibration"]["in_default_target"]:
        raise ConfigError(
            "calibration.in_default_target: a calibration starts servers, which backend external never does; "
            "set it to false (calibrate on a host where specsweep starts SGLang)"
        )


def check_pass_env(config: dict) -> None:
    """server.pass_env names no variable that changes decoding: its value would come from the host's shell, which
    no cell key holds (launcher.decoding_variable)."""
    for index, name in enumerate(config["server"]["pass_env"]):
        if decoding_variable(name):
            raise ConfigError(
                f"server.pass_env[{index}]: {name} changes how SGLang decodes, so its value must come from the "
                f"configuration, where it is part of the cells' keys, not from the shell: set it in server.env "
                "(every server) or a method's env (methods[].env)"
            )


def check_slo(config: dict) -> None:
    """Each service-level objective (slo.objectives) has a name of its own and sets at least one target: its name
    names the summary's columns, and an objective without a target would be met by every request that succeeded."""
    seen: dict = {}
    for index, objective in enumerate(config["slo"]["objectives"]):
        name = objective["name"]
        if name in seen:
            raise ConfigError(
                f"slo.objectives[{index}].name: '{name}' is already the name of slo.objectives[{seen[name]}]; "
                "give each objective a name of its own"
            )
        seen[name] = index
        if all(objective.get(key) is None for key in ("ttft_ms", "tpot_ms", "itl_ms")):
            raise ConfigError(
                f"slo.objectives[{index}] ({name}): sets no target; give at least one of ttft_ms, tpot_ms, itl_ms "
                "(milliseconds), e.g. {name: " + name + ", ttft_ms: 2000, tpot_ms: 50}"
            )


def check_acceptance(config: dict, where: str = "sim") -> None:
    """Every acceptance key of a sim block (``where``: sim, or engines[i].sim for an engine's view) is a parameter of
    the acceptance model (the simulator and the plan read them)."""
    unknown = sorted(set(config["sim"]["acceptance"]) - set(ACCEPTANCE))
    if unknown:
        raise ConfigError(
            f"{where}.acceptance.{unknown[0]}: not a parameter of the acceptance model; known: "
            f"{', '.join(sorted(ACCEPTANCE))} (specsweep/modelling/acceptance.py ACCEPTANCE)"
            + did_you_mean(unknown[0], ACCEPTANCE)
        )


def check_engines(config: dict) -> None:
    """Engine names are unique, and each engine's view (engines.view: its sim block merged over the top-level one)
    names known acceptance parameters and, on the simulated backend, known profiles. Simulated engines run on one
    clock: their cells are compared side by side, and times measured on clocks of different speeds (sim.time_scale)
    cannot be. Each mistake names engines[i].sim.<key>."""
    names = engine_names(config)
    clocks: list[tuple[int, str, float]] = []  # (index, name, time_scale)
    for index, name in enumerate(names):
        if names.count(name) > 1:
            raise ConfigError(f"engines[{index}]: duplicated engine name '{name}'; give each engine a unique name")
        seen = engine_view(config, name)
        check_acceptance(seen, f"engines[{index}].sim")
        if seen["sim"].get("gpus") != config["sim"].get("gpus"):
            raise ConfigError(
                f"engines[{index}].sim.gpus: {seen['sim'].get('gpus')} (engine {name}) differs from sim.gpus "
                f"{config['sim'].get('gpus')}; the simulated host is one for every engine: set it once, as sim.gpus"
            )
        if config["backend"] == "sim":
            check_sim_profiles(seen, f"engines[{index}].sim")
            clocks.append((index, name, float(seen["sim"]["time_scale"])))
    for index, name, scale in clocks[1:]:
        first, first_name, first_scale = clocks[0]
        if scale != first_scale:
            raise ConfigError(
                f"engines[{index}].sim.time_scale: {scale:g} (engine {name}) differs from engines[{first}].sim."
                f"time_scale {first_scale:g} (engine {first_name}); engines are compared cell by cell, and times "
                "measured on simulated clocks of different speeds cannot be. Give every engine the same time_scale "
                "(set it once, as sim.time_scale)"
            )


def check_engine_calibrations(config: dict) -> None:
    """Each engine's cost model chosen now, in its view of a configuration whose own is resolved
    (calibration.choose.resolve, engines.view), so that a calibration an engine names (its sim.calibration) that is
    not there, or not of a configured TP size, stops the workflow before any job, naming engines[i].sim.calibration."""
    for index, name in enumerate(engine_names(config)):
        try:
            engine_view(config, name)
        except ConfigError as exc:
            where = f"engines[{index}]." if str(exc).startswith("sim.") else f"engines[{index}] ({name}): "
            raise ConfigError(f"{where}{exc}") from None


def check_model_profiles(config: dict) -> None:
    """Every model profile, shipped or under sim.profiles.models, must state the sizes the cost model prices with
    (specsweep.modelling.profiles.model_problems: q_dim, hidden_size, ...), on every backend (the plan prices with
    them too)."""
    try:
        profiles((config.get("sim") or {}).get("profiles"))
    except ProfileError as exc:
        raise ConfigError(f"sim.profiles: {exc}") from None


def resolve_auto_runtime(config: dict) -> None:
    """``sim.runtime: auto`` (the default), at the top level and in every engine's block, becomes the runtime profile it
    means for that block's GPU and model profile (profiles.auto_runtime: the measured one where there is one, else the
    generic ``sglang``), so that servers, cells, the plan and the report name the profile that priced them."""
    blocks = [config["sim"]] + [e["sim"] for e in config.get("engines") or [] if isinstance(e.get("sim"), dict)]
    for block in blocks:
        if block.get("runtime") == AUTO:
            block["runtime"] = auto_runtime(block["gpu"], block["model_profile"], block.get("profiles"))


def check_sim_profiles(config: dict, where: str = "sim") -> None:
    """The simulated backend's gpu, model profile and runtime must exist (shipped or under sim.profiles), and every
    model profile state its sizes (check_model_profiles); ``where`` names the block: sim, or engines[i].sim for an
    engine's view."""
    try:
        known = profiles(config["sim"]["profiles"])
    except ProfileError as exc:
        raise ConfigError(f"{where}.profiles: {exc}") from None
    for key, kind in (
        ("gpu", "gpus"),
        ("model_profile", "models"),
        ("draft_model_profile", "models"),
        ("runtime", "runtimes"),
    ):
        if config["sim"][key] not in known[kind]:
            also = "" if where == "sim" else f" or sim.profiles.{kind}"
            raise ConfigError(
                f"{where}.{key}: unknown profile '{config['sim'][key]}'; known: "
                f"{', '.join(sorted(known[kind]))} (or define it under {where}.profiles.{kind}{also})"
                + did_you_mean(config["sim"][key], known[kind])
            )


def check_workload_files(config: dict) -> None:
    """Read every user prompt file now, so that bad data stops the run before any job (naming file and line)."""
    for w in config["workloads"]:
        if w.get("source") == "file":
            try:
                build(
                    w,
                    config["seed"],
                    config["sampling"]["thinking"],
                    config["model"].get("path"),
                    config["model"]["context_length"],
                )
            except WorkloadError as exc:
                raise ConfigError(f"workloads ({w['name']}): {exc}") from None


def check_launch_flags(config: dict) -> None:
    """Parse every server's launch arguments with SGLang's recorded option table (plus declared extra flags)."""
    builds: list[str | None] = list(engine_names(config)) or [None]
    for engine in builds:
        build = engine_view(config, engine)["sglang"]
        try:
            check_argv(list(config["server"]["flags"]), build["options_table"], build["extra_flags"])
        except FlagError as exc:
            raise ConfigError(f"server.flags: {exc}" + (f" (engine {engine})" if engine else "")) from None
    for server in servers(config):
        job = server_job(config, server["tp"], server["method"])
        table, extra = job.sglang["options_table"], job.sglang["extra_flags"]
        try:
            check_argv(server_arguments(job, port=30000, max_context=32768), table, extra)
        except ServerError as exc:
            raise ConfigError(f"methods: method '{server['method']}': {exc}") from None
        except FlagError as exc:
            raise ConfigError(
                f"methods: method '{server['method']}': {exc}; fix its flags (or the "
                f"algorithms spelling), or declare the flag in sglang.extra_flags"
            ) from None


def _sessions_origin(workload: dict, index: int, concurrency: int, load: dict) -> str:
    """Where a cell's session count comes from (jobs.cell_requests), as the key the user set or the default's
    formula: 'workloads[0].requests', 'load.waves 4 x concurrency 256' or 'load.min_requests 32'."""
    if workload.get("requests"):
        return f"workloads[{index}].requests"
    if load["waves"] * concurrency >= load["min_requests"]:
        return f"load.waves {load['waves']} x concurrency {concurrency}"
    return f"load.min_requests {load['min_requests']}"


def _without_levels(workload: dict, index: int, dropped: list[int], kept: list[int]) -> str:
    """How to leave concurrency levels out of a workload's cells, naming the key that gave them: the workload's own
    list (workloads[i].concurrency), or the top-level `concurrency`, which a list of the workload's own can replace
    for it alone (``kept``: the levels left, for the example)."""
    levels = ", ".join(str(c) for c in dropped)
    if workload.get("concurrency"):
        return f"leave {levels} out of workloads[{index}].concurrency"
    own = f", e.g. workloads[{index}].concurrency: {kept}" if kept else f" (workloads[{index}].concurrency)"
    return f"leave {levels} out of concurrency, or give workloads[{index}] a concurrency list of its own{own}"


def _between(low: int, high: int) -> str:
    return f"{high}" if low == high else f"between {low} and {high}"


def _requests_fix(w: dict, index: int, verb: str, levels: list[int], least: dict, cap: int) -> str:
    """Setting workloads[i].requests (``verb``: set, lower, raise) to a count that holds every level some count can
    hold (at least ``least[c]``, at most ``cap``), the others left out."""
    fits = [c for c in levels if least[c] <= cap]
    low = max((least[c] for c in fits), default=1)
    over = [c for c in levels if c not in fits]
    return f"{verb} workloads[{index}].requests to {_between(low, cap)}" + (
        f" and {_without_levels(w, index, over, fits)}" if over else ""
    )


def check_cells_reach_label(config: dict) -> None:
    """Every closed-loop cell can hold its concurrency: at least MIN_WAVES sessions per slot, no session replayed.
    A refusal names the first cell that cannot, where its session count and its concurrency come from (the keys
    the user set, or the default's formula), and fixes that work for every level of its workload at once: a
    workload's ``requests`` applies to all its levels, and no request count holds a concurrency above
    1/MIN_WAVES of the distinct sessions its source has."""
    load, closed = config["load"], config["load"]["model"] == "closed"
    for index, w in enumerate(config["workloads"]):
        if w.get("source") == "trace":  # open loop at the trace's times: its window's requests, whatever the level
            continue
        available = distinct_sessions(w, config["model"]["context_length"])
        cap = MAX_SESSIONS if available is None else min(available, MAX_SESSIONS)  # sessions a cell may send
        levels = workload_concurrency(config, w)
        needed = {c: cell_requests(w, c, load) for c in levels}
        least = {c: MIN_WAVES * c if closed else 1 for c in levels}  # sessions that hold c after the first wave
        held = [c for c in levels if least[c] <= needed[c] <= cap]  # as configured
        dropped = [c for c in levels if c not in held]
        by_level = _without_levels(w, index, dropped, held)
        # the fixes that work: the request count where the workload sets it (the culprit), else where a count
        # would hold a level the default sizing cannot; leaving out the levels the default sizing cannot hold
        given, rescued = bool(w.get("requests")), [c for c in dropped if least[c] <= cap]
        fixes = [_requests_fix(w, index, "lower" if given else "set", levels, least, cap)] if given or rescued else []
        fixes += [] if given else [by_level]
        if not given and any(needed[c] > cap for c in levels):  # sized by load.waves x concurrency, or at least
            waves = cap // max(levels)  # load.min_requests: lowering those holds every level it can
            if load["min_requests"] > cap:
                fixes.append(f"lower load.min_requests to at most {cap}")
            elif waves >= MIN_WAVES:
                fixes.append(f"lower load.waves to {_between(MIN_WAVES, waves)}")
        for c in dropped[:1]:
            n, origin = needed[c], _sessions_origin(w, index, c, load)
            where = f"cell {w['name']} at concurrency {c} (workloads[{index}])"
            if n > MAX_SESSIONS:
                raise ConfigError(
                    f"{where}: {n} sessions is more than the {MAX_SESSIONS} a cell may send (the {n}: {origin}); "
                    + ", or ".join(fixes)
                )
            if n > cap:
                most = (
                    f" (a closed-loop cell needs at least {MIN_WAVES} sessions per request in flight: this source "
                    f"holds a concurrency of at most {cap // MIN_WAVES})"
                    if closed and any(least[level] > cap for level in levels)
                    else ""
                )
                raise ConfigError(
                    f"{where}: needs {n} sessions but its source has {available} distinct ones that fit "
                    f"model.context_length (the {n}: {origin}); replaying a session inside a cell would hit the prefix "
                    f"cache{most}. "
                    f"Fix: {', or '.join(fixes + ['use a source with more sessions'])}"
                )
            # closed, and fewer sessions than MIN_WAVES per slot (a workload's requests: the default sizing holds)
            raise ConfigError(
                f"{where}: {n} sessions cannot hold {c} requests in flight after the first wave (at "
                f"least {least[c]} needed); remove workloads[{index}].requests to size cells by concurrency "
                f"(load.waves x concurrency), {_requests_fix(w, index, 'raise', levels, least, cap)}, or {by_level}"
            )
