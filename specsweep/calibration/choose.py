"""Which cost model a configuration uses for each TP size, what it is called, and what names a calibration.

``snakemake calibrate`` measures the engine on the user's own GPUs and writes one calibration per fingerprint
under results/calibration/ (``<digest of the fingerprint>.yaml``, its measured table beside it)::

    fingerprint: {gpu, gpu_count, driver, engine_version, engine_commit, model, tp}
    measured_on: {gpu, date}
    largest_deviation: 0.04     # the worst measured shape's |simulated - measured| / measured, a fraction
    runtime: {...}              # a runtime profile: the keys of a runtime of specsweep/data/sim_profiles.yaml
    startup: {cold_s, warm_s}   # launch to ready: the first server on a host, a later one

    content_digest: ...         # SHA-256 of the canonical JSON of everything above it (calibration_text)

(a file without ``runtime:`` holds the runtime profile's keys at its top level instead). A file is read only when
its content matches its digest (a truncated file has lost it: it is the last key) and its runtime is one the cost
model can price (modelling.cost.runtime_problems: every parameter known and within its bounds, none its kind of runtime
needs missing); ``read_calibration`` names the file and the key otherwise. ``sim.calibration`` picks, for every
configured TP size:

- ``auto`` (the default): the newest (``measured_on.date``, then the file's time) calibration of results/calibration/
  that matches. On ``backend: sglang`` (what ``snakemake plan`` prices) a calibration matches when its fingerprint
  is this host's, as the environment record results/env/sglang.json gives it (GPU model and count, driver, engine
  version and commit), for the configured model (``model.path`` or ``model.name``) and the TP size; without that
  record none does. On ``backend: sim`` it matches when its GPU is the simulated one (``gpu_matches``: the
  measured name "NVIDIA H200" is the profile H200), for the configured model and the TP size, and a calibration
  of the simulator itself only for the simulated build it measured (``sim_engine_commit``: the profiles it
  emulates), so that each engine of a configuration finds its own.
- ``none``: no calibration.
- a path: that calibration file, for its own TP size whatever it was measured on; or a folder searched as
  ``auto`` searches results/calibration/.

A calibration matching no configured TP size is ignored (``snakemake plan`` lists why). A TP size without one
uses the configured runtime profile (``sim.runtime``: the generic roofline, its parameters not measured on these
GPUs). The choice is made once, when the workflow reads its configuration (``resolve``); the simulated servers,
``snakemake plan``, every simulated cell and the report's setup table then say which one they used (``label``).

A calibration's files are named by 12 hex digits of its fingerprint (``fingerprint``, ``fingerprint_digest``):
``profile_path`` and ``table_path``, listed per TP and engine in FINGERPRINTS.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import yaml

from .. import __version__
from ..canon import digest, package_digest, yaml_data
from ..errors import CalibrationError, ConfigError
from ..layout import RESULTS, environment_path
from ..modelling.cost import RUNTIME_BOUNDS, runtime_problems
from ..modelling.profiles import profiles, runtime_description

CALIBRATIONS = f"{RESULTS}/calibration"
FINGERPRINTS = f"{CALIBRATIONS}/fingerprints.json"  # every configured TP's fingerprint and digest, per engine
FINGERPRINT = ("gpu", "gpu_count", "driver", "engine_version", "engine_commit", "model", "tp")
HOST_KEYS = ("gpu", "gpu_count", "driver", "engine_version", "engine_commit")  # what the environment record gives
DIGEST_KEY = "content_digest"  # a calibration file's last key: the digest of everything before it
HEADER = ("fingerprint", "measured_on", "largest_deviation", "startup", "runtime", "table", DIGEST_KEY)


def _unreadable(path, reason: str) -> CalibrationError:
    """The error of a calibration file that cannot be read: its ``path``, the ``reason`` (the key and what is wrong
    with it), and what to do."""
    return CalibrationError(f"{path}: {reason}; {_REDO}", path=str(path), reason=reason)


def normalise_gpu(name: str) -> str:
    """A GPU's name as profiles spell it: upper case, the vendor's "NVIDIA" dropped, every run of other characters
    a dash ("NVIDIA H100 80GB HBM3" -> "H100-80GB-HBM3", "RTX-PRO-6000" stays)."""
    words = re.sub(r"[^A-Z0-9]+", "-", name.upper()).strip("-")
    return re.sub(r"^NVIDIA-", "", words)


def gpu_matches(profile: str, gpu: str) -> bool:
    """Whether a GPU profile's name (H200, RTX-PRO-6000) names a measured GPU ("NVIDIA H200", "NVIDIA RTX PRO 6000
    Blackwell Server Edition"): its normalised name is the GPU's, or the first words of it."""
    want, have = normalise_gpu(profile), normalise_gpu(gpu)
    return bool(want) and (have == want or have.startswith(want + "-"))


def gpu_profile(gpu: str, known: dict) -> str | None:
    """The GPU profile (of ``known``, the gpus of the profiles) a measured GPU is, the longest name first (so that
    a profile H100-PCIE would win over H100 for "NVIDIA H100 PCIe"); None when none is."""
    names = sorted((n for n in known if gpu_matches(n, gpu)), key=lambda n: -len(normalise_gpu(n)))
    return names[0] if names else None


def _number(value, where: str, path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _unreadable(path, f"{where}: {value!r} is not a finite number >= 0")
    return float(value)


_REDO = (
    "`snakemake calibrate` writes it again if it is a calibration of this configuration (from the cached "
    "measurements, starting no server where they are all there); else remove the file"
)


def calibration_text(profile: dict) -> str:
    """A calibration profile as its file holds it: YAML, its keys in order, then DIGEST_KEY, the SHA-256 of the
    canonical JSON of the rest as it reads back (so that a value edited, or a file cut short, which loses its last
    key, does not verify)."""
    body = {k: v for k, v in profile.items() if k != DIGEST_KEY}
    text = yaml.safe_dump(body, sort_keys=False)
    return text + yaml.safe_dump({DIGEST_KEY: digest(yaml_data(text))})


def read_calibration(path: str | Path) -> dict:
    """A calibration file, checked: {path, fingerprint, gpu, date, largest_deviation, runtime, startup (or None)}.
    Its content must match its digest (calibration_text), its runtime be one the cost model can price
    (runtime_problems). Raises CalibrationError naming the file and the key."""
    try:
        data = yaml_data(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise _unreadable(path, f"cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise _unreadable(path, "not a mapping of a calibration")
    if DIGEST_KEY not in data:
        raise _unreadable(
            path,
            f"{DIGEST_KEY}: missing (the file was cut short, or not written by `snakemake calibrate`: a runtime "
            "profile of your own goes in sim.profiles.runtimes)",
        )
    if data[DIGEST_KEY] != digest({k: v for k, v in data.items() if k != DIGEST_KEY}):
        raise _unreadable(
            path,
            f"its content does not match its {DIGEST_KEY} (edited or damaged since `snakemake calibrate` wrote it)",
        )
    for key in ("fingerprint", "measured_on"):
        if not isinstance(data.get(key), dict):
            raise _unreadable(path, f"{key}: missing or not a mapping")
    fingerprint = data["fingerprint"]
    missing = [k for k in ("model", "tp") if fingerprint.get(k) in (None, "")]
    if missing:
        raise _unreadable(path, f"fingerprint.{missing[0]}: missing")
    if isinstance(fingerprint["tp"], bool) or not isinstance(fingerprint["tp"], int) or fingerprint["tp"] < 1:
        raise _unreadable(path, f"fingerprint.tp: {fingerprint['tp']!r} is not a TP size")
    gpu = data["measured_on"].get("gpu") or fingerprint.get("gpu")
    date = data["measured_on"].get("date")
    if not gpu or not date:
        raise _unreadable(path, "measured_on: needs gpu and date")
    runtime = data["runtime"] if "runtime" in data else {k: v for k, v in data.items() if k not in HEADER}
    if not isinstance(runtime, dict) or not runtime:
        raise _unreadable(path, "runtime: missing or not a mapping of a runtime profile")
    problems = runtime_problems(runtime)
    if problems:
        raise _unreadable(path, "; ".join(f"runtime.{p}" for p in problems))
    startup = data.get("startup")
    if startup is not None:
        if not isinstance(startup, dict) or set(startup) != {"cold_s", "warm_s"}:
            raise _unreadable(path, "startup: needs exactly cold_s and warm_s (seconds)")
        for key, value in startup.items():
            why = RUNTIME_BOUNDS["startup_seconds"].problem(value)
            if why is not None:
                raise _unreadable(path, f"startup.{key}: {why}")
        startup = {k: float(v) for k, v in startup.items()}
    return {
        "path": str(path),
        "fingerprint": {k: fingerprint.get(k) for k in FINGERPRINT},
        "gpu": str(gpu),
        "date": str(date),
        "largest_deviation": _number(data.get("largest_deviation"), "largest_deviation", path),
        "runtime": runtime,
        "startup": startup,
        "simulated": data.get("simulated") is True,  # measured on the simulated backend (its fingerprint's build)
    }


def label(calibration: dict | None, runtime: str) -> str:
    """What a cost model is called in plan.md, cells and the report: "measured on <GPU> on <date>, largest
    deviation x%", or "not calibrated: <the runtime profile sim.runtime, as profiles.runtime_description says it>"
    (the measured runtime, the generic one, or another profile)."""
    if calibration is None:
        return f"not calibrated: {runtime_description(runtime)}"
    return (
        f"measured on {calibration['gpu']} on {calibration['date']}, "
        f"largest deviation {calibration['largest_deviation'] * 100:.1f}%"
    )


def host_fingerprint(environment: dict) -> dict:
    """The part of a calibration's fingerprint an SGLang environment record (environment.probe) gives: GPU model and
    count, driver, engine version ("sglang <version>") and commit (the build's source commit, else the digest of the
    wheel it was installed from, else the configured build label)."""
    server, hardware = environment["server"], environment["hardware"]
    gpus = hardware.get("gpus") or []
    archive = ((server.get("source") or {}).get("archive_info") or {}).get("hash")
    return {
        "gpu": gpus[0]["name"] if gpus else None,
        "gpu_count": len(gpus),
        "driver": hardware.get("driver"),
        "engine_version": f"sglang {server.get('version')}",
        "engine_commit": server.get("commit") or archive or server.get("build"),
    }


def emulated_profiles(config: dict) -> dict:
    """The gpu, model, draft-model and runtime profiles the simulated backend emulates (overrides merged)."""
    p, sim = profiles(config["sim"]["profiles"]), config["sim"]
    return {
        "gpu": p["gpus"][sim["gpu"]],
        "model": p["models"][sim["model_profile"]],
        "draft_model": p["models"].get(sim.get("draft_model_profile", "qwen3-0.6b")),
        "runtime": p["runtimes"][sim["runtime"]],
    }


def sim_engine_commit(config: dict) -> str:
    """The simulated engine's "commit" in a calibration's fingerprint: 12 hex digits of the profiles it emulates and
    of its cost model's code (the cost model and the decodings it prices), so that a calibration of the simulator is
    of one simulated build."""
    return digest([emulated_profiles(config), package_digest("modelling/cost.py", "modelling/decoding.py")])[:12]


def fingerprint(environment: dict, config: dict, tp: int) -> dict:
    """What a calibration measured: {gpu, gpu_count, driver, engine_version, engine_commit, model, tp}, from the
    environment record (results/env/<backend>.json) and the configuration. On SGLang the engine commit is the
    build's source commit, else the digest of the wheel it was installed from, else the configured build label.
    On the simulated backend the GPU is the simulated one (``sim.gpu``, "(simulated)"), tp of them, and the
    engine commit a digest of the profiles it emulates and of its cost model's code."""
    model = config["model"]["name"]
    if environment["backend"] == "sim":
        sim = config["sim"]
        return {
            "gpu": f"{sim['gpu']} (simulated)",
            "gpu_count": tp,
            "driver": None,
            "engine_version": f"specsweep-sim {environment['server'].get('version', __version__)}",
            "engine_commit": sim_engine_commit(config),
            "model": model,
            "tp": tp,
        }
    return {**host_fingerprint(environment), "model": model, "tp": tp}


def fingerprint_digest(value: dict) -> str:
    """The short digest that names a calibration's files: 12 hex digits of the fingerprint's canonical JSON."""
    return digest({k: value[k] for k in FINGERPRINT})[:12]


def profile_path(name: str) -> str:
    return f"{CALIBRATIONS}/{name}.yaml"


def table_path(name: str) -> str:
    return f"{CALIBRATIONS}/{name}.csv"


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and str(a) == str(b))


def mismatch(calibration: dict, config: dict, environment: dict | None) -> str | None:
    """Why a calibration is not for this configuration (and host, on the sglang backend), or None when it is."""
    fp = calibration["fingerprint"]
    if fp["tp"] not in config["tp"]:
        return f"TP {fp['tp']}, not configured (tp: {config['tp']})"
    models = {config["model"].get("path"), config["model"]["name"]} - {None}
    if str(fp["model"]) not in models:
        return f"model {fp['model']}, not {' or '.join(sorted(models))}"
    if config["backend"] == "sim":
        if not gpu_matches(config["sim"]["gpu"], calibration["gpu"]):
            return f"measured on {calibration['gpu']}, not the simulated {config['sim']['gpu']} (sim.gpu)"
        if calibration["simulated"]:
            build = sim_engine_commit(config)
            if not _same(fp.get("engine_commit"), build):
                return f"of the simulated build {fp.get('engine_commit')}, not this one's {build}"
        return None
    if environment is None:
        return "this host's environment is not probed yet (run `snakemake results/env/sglang.json`)"
    host = host_fingerprint(environment)
    for key in HOST_KEYS:
        if not _same(fp.get(key), host[key]):
            return f"{key} {fp.get(key)}, not this host's {host[key]}"
    return None


def _newest_first(calibrations: list[dict]) -> list[dict]:
    def when(c):
        try:
            return (c["date"], os.path.getmtime(c["path"]))
        except OSError:
            return (c["date"], 0.0)

    return sorted(calibrations, key=when, reverse=True)


def choose(config: dict, environment: dict | None = None, folder: str = CALIBRATIONS) -> dict:
    """{"by_tp": {TP as text: the TP's choice}, "ignored": [why each calibration found was not used], "broken": [why
    each file found cannot be read (read_calibration)]}; a choice is {label, calibration (its file or None), runtime
    (the calibrated runtime profile or None), startup ({cold_s, warm_s} or None), gpu_profile (the GPU profile it was
    measured on), gpu_count}. A broken file found in a folder is named in a warning and left out of the choice (the
    workflow's runs refuse to start while one is there: see ``broken``). Raises ConfigError for a
    ``sim.calibration`` that is neither auto, none, nor a calibration file or folder, or names a broken file."""
    setting = config["sim"].get("calibration", "auto")
    found: list[dict] = []
    ignored: list[str] = []
    broken: list[str] = []
    forced = False
    if setting != "none":
        place = Path(folder if setting == "auto" else setting)
        if setting != "auto" and not place.exists():
            raise ConfigError(
                f"sim.calibration: '{setting}' is neither auto, none, nor a calibration file or folder; give one "
                f"(`snakemake calibrate` writes them to {CALIBRATIONS}/)"
            )
        if place.is_file():
            forced = True
            try:
                found = [read_calibration(place)]
            except CalibrationError as exc:
                raise ConfigError(f"sim.calibration: {exc}") from None
            if found[0]["fingerprint"]["tp"] not in config["tp"]:
                raise ConfigError(
                    f"sim.calibration: {place} was measured at TP {found[0]['fingerprint']['tp']}, which tp "
                    f"({config['tp']}) does not have; add it to tp or give another calibration"
                )
        elif place.is_dir():
            for path in sorted(place.glob("*.yaml")):
                try:
                    found.append(read_calibration(path))
                except CalibrationError as exc:
                    print(f"warning: calibration ignored: {exc}", file=sys.stderr)
                    ignored.append(str(exc))
                    broken.append(str(exc))
    known = profiles(config["sim"].get("profiles"))["gpus"]
    by_tp = {}
    for tp in config["tp"]:
        chosen: dict | None = None
        for calibration in _newest_first([c for c in found if c["fingerprint"]["tp"] == tp]):
            why = None if forced else mismatch(calibration, config, environment)
            if why is not None:
                ignored.append(f"{calibration['path']}: {why}")
            elif chosen is None:
                chosen = calibration
            else:
                ignored.append(f"{calibration['path']}: an older calibration of TP {tp} than {chosen['path']}")
        by_tp[str(tp)] = _choice(config, chosen, known)
    ignored += [
        f"{c['path']}: {mismatch(c, config, environment)}" for c in found if c["fingerprint"]["tp"] not in config["tp"]
    ]
    return {"by_tp": by_tp, "ignored": ignored, "broken": broken}


def broken(views: list[dict]) -> list[str]:
    """Why each calibration file resolved configurations found (``views``: the configuration and every engine's view
    of it, engines.views) cannot be read: what stops a run (a broken calibration would otherwise leave its TP size
    priced by the roofline, its cells measured again under another cost model)."""
    return list(dict.fromkeys(why for view in views for why in (view.get("cost_model") or {}).get("broken", [])))


def _choice(config: dict, calibration: dict | None, known_gpus: dict) -> dict:
    sim = config["sim"]
    if calibration is None:
        return {
            "label": label(None, sim["runtime"]),
            "calibration": None,
            "runtime": None,
            "startup": None,
            "gpu_profile": sim["gpu"],
            "gpu_count": None,
        }
    return {
        "label": label(calibration, sim["runtime"]),
        "calibration": calibration["path"],
        "runtime": calibration["runtime"],
        "startup": calibration["startup"],
        "gpu_profile": gpu_profile(calibration["gpu"], known_gpus) or sim["gpu"],
        "gpu_count": calibration["fingerprint"].get("gpu_count"),
    }


def recorded_environment(backend: str, engine: str | None = None) -> dict | None:
    """This host's environment record (results/env/sglang.json, an engine's sglang@<engine>.json) where the sglang
    backend has one, else None: what a calibration's fingerprint is matched with (a damaged record counts as none;
    its job writes it again)."""
    if backend != "sglang":
        return None
    try:
        return json.loads(Path(environment_path(backend, engine)).read_text())
    except (OSError, ValueError):
        return None


def resolve(config: dict, environment: dict | None = None, folder: str = CALIBRATIONS) -> dict:
    """The configuration with its cost models chosen (``choose``) under the key ``cost_model``: what the jobs, the
    plan and the report read (``of``, ``sim_settings``, ``labels``)."""
    return {**config, "cost_model": choose(config, environment, folder)}


def of(config: dict, tp: int) -> dict:
    """The cost model of one TP size (see choose); a configuration not resolved uses the configured runtime."""
    chosen = (config.get("cost_model") or {}).get("by_tp", {}).get(str(tp))
    return chosen or _choice(config, None, {})


def uncalibrated(config: dict) -> dict:
    """The configuration with every TP size on its configured runtime: no calibration chosen or resolved (what a
    calibration measures: the engine as configured, never an earlier calibration of it)."""
    return {**config, "cost_model": {}, "sim": {**config["sim"], "calibration": "none"}}


def sim_settings(config: dict, tp: int) -> dict:
    """The simulator's settings (sim) for one TP size with its cost model in them: a calibrated runtime profile
    becomes the runtime ``calibrated-tp<TP>`` of ``profiles.runtimes``, on the GPU profile it was measured on, and
    ``cost_model`` says which one it is ({label, calibration}). What a simulated server is started with and a cell's
    key holds, so a cell simulated with another cost model is another cell (the calibration named by its file's name,
    not where it lies, so that hosts sharing a cache share its cells)."""
    chosen = of(config, tp)
    sim = {k: v for k, v in config["sim"].items() if k not in ("calibration", "gpus")}  # gpus: the host's (jobs)
    if chosen["runtime"] is not None:
        name = f"calibrated-tp{tp}"
        overrides = dict(sim.get("profiles") or {})
        overrides["runtimes"] = {**overrides.get("runtimes", {}), name: chosen["runtime"]}
        sim.update(runtime=name, profiles=overrides, gpu=chosen["gpu_profile"])
    calibration = Path(chosen["calibration"]).name if chosen["calibration"] else None
    sim["cost_model"] = {"label": chosen["label"], "calibration": calibration}
    return sim


def labels(config: dict) -> str:
    """Every TP size's cost model in one line: its label when all share one, else "TP 1: ...; TP 2: ..."."""
    texts = {tp: of(config, tp)["label"] for tp in config["tp"]}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"TP {tp}: {text}" for tp, text in texts.items())
