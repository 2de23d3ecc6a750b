# `snakemake calibrate`: per configured TP (and engine, configuration engines), measure the engine through its HTTP API and fit the simulator's runtime
# profile (specsweep/calibration/). The files are named by a digest of what was measured (GPU model and count,
# driver, engine version and commit, model, TP), which the environment record gives: a checkpoint reads it and
# names them. Each server's measurements are cached in cache_dir/calibration/, so a rerun with the same
# fingerprint starts no server. A profile there that cannot be read (cut short, edited: its content digest; a
# runtime parameter out of bounds) is made again, as a missing one is. Not part of the default target unless
# calibration.in_default_target is true (the Snakefile includes this file after rule all: see the end of this file).
import json
from types import SimpleNamespace

from specsweep.calibration import choose as ss_choose
from specsweep.calibration import run as ss_calibration
from specsweep.errors import CalibrationError


localrules:
    calibrate,
    calibration_fingerprints,


# the engines calibrated: each configured engine (its own build and environment record), else the one build
CALIBRATED_ENGINES = engines.names(CONFIG) or [None]


checkpoint calibration_fingerprints:
    input:
        environments=rebuilt_when_missing(
            [layout.environment_path(CONFIG["backend"], engine) for engine in CALIBRATED_ENGINES]
        ),
    output:
        ss_choose.FINGERPRINTS,
    params:
        **settings_params(
            "config",
            lambda wildcards: {k: CONFIG[k] for k in ("backend", "model", "tp", "sim", "engines", "methods", "sglang")},
            lambda wildcards: "what the calibrations are named by",
            lambda wildcards: "calibration_fingerprints",
        ),
        engines=json.dumps(CALIBRATED_ENGINES),
    log:
        "logs/calibration/fingerprints.log",
    script:
        "../scripts/calibration_fingerprints.py"


def _calibration(digest):
    """The fingerprint entry ({tp, engine, fingerprint, digest}) that the checkpoint gave this digest."""
    with open(checkpoints.calibration_fingerprints.get().output[0]) as handle:
        entries = {e["digest"]: e for e in json.load(handle)}
    if digest not in entries:
        raise WorkflowError(f"{ss_choose.profile_path(digest)}: no configured TP has this fingerprint digest")
    return entries[digest]


def _digests():
    """The digests the checkpoint gave the configured TPs (and engines)."""
    with open(checkpoints.calibration_fingerprints.get().output[0]) as handle:
        return [e["digest"] for e in json.load(handle)]


def _unreadable(path):
    """Why a calibration profile cannot be used (calibration.choose.read_calibration), or None."""
    try:
        ss_choose.read_calibration(path)
    except CalibrationError as exc:
        return f"{exc.path}: {exc.reason}"
    return None


def calibration_outputs(wildcards):
    """Every configured TP's profile and table (after the checkpoint named them); a profile that is there but
    cannot be read is made again."""
    profiles = [ss_choose.profile_path(name) for name in _digests()]
    rebuilt_when_missing(profiles, _unreadable)(wildcards)
    return [path for name in _digests() for path in (ss_choose.profile_path(name), ss_choose.table_path(name))]


def calibrations_written():
    """The configuration's calibration profiles, once they are written and need nothing more in this run (until
    then Snakemake's IncompleteCheckpointException, which makes the jobs that ask wait for them)."""
    return [checkpoints.calibration.get(digest=name).output[0] for name in _digests()]


def calibration_environment(wildcards):
    """The environment record of the engine a calibration measures."""
    engine = _calibration(wildcards.digest).get("engine")
    return rebuilt_when_missing(layout.environment_path(CONFIG["backend"], engine))(wildcards)


def calibration_job_settings(wildcards):
    """Everything one TP's calibration depends on (its rerun trigger): its engine's view of the configuration and
    environment record."""
    entry = _calibration(wildcards.digest)
    with open(layout.environment_path(CONFIG["backend"], entry.get("engine"))) as handle:
        environment = json.load(handle)
    view = engines.view(CONFIG, entry.get("engine"))
    return ss_calibration.calibration_job(view, environment, entry["tp"])


def calibration_label(wildcards):
    """A calibration job's name: calibration tp1 (engine e), its digest."""
    entry = _calibration(wildcards.digest)
    engine = f", engine {entry['engine']}" if entry.get("engine") else ""
    return f"calibration tp{entry['tp']}{engine} ({wildcards.digest})"


def calibration_gpus(wildcards):
    """GPUs a calibration job holds: its TP size, as a server job (see server_gpus)."""
    return server_gpus(SimpleNamespace(tp=_calibration(wildcards.digest)["tp"]))


# a checkpoint: with calibration.in_default_target the cells' jobs are made once it has run (calibrations_written)
checkpoint calibration:
    input:
        environment=calibration_environment,
        fingerprints=ss_choose.FINGERPRINTS,
    output:
        profile=ss_choose.profile_path("{digest}"),
        table=ss_choose.table_path("{digest}"),
    params:
        **settings_params("job", calibration_job_settings, calibration_label, calibration_label),
    resources:
        gpu=calibration_gpus,
    wildcard_constraints:
        digest=r"[0-9a-f]{12}",
    log:
        "logs/calibration/{digest}.log",
    script:
        "../scripts/calibrate.py"


rule calibrate:
    input:
        calibration_outputs,


# calibration.in_default_target: the default target's rule (all, above this file's include) also asks for every
# TP's calibration. Snakemake keeps the default target of the main Snakefile (a default_target directive in an
# included file is reset when the include ends), so the files are added to that rule's input.
if CONFIG["calibration"]["in_default_target"]:
    rules.all.rule.set_input(calibration_outputs)
