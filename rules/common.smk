# Config -> validated, normalised config; the tables and params every rule uses.
import os
import re
import sys

from jsonschema import ValidationError
from snakemake.io import IOFile
from snakemake.scheduling.job_scheduler import JobScheduler
from snakemake.settings.enums import RerunTrigger
from snakemake.utils import validate
import yaml

from specsweep import config as ss_config
from specsweep import engines, jobs, launcher, layout, rerun, runs
from specsweep import gpus as ss_gpus
from specsweep.calibration import choose as ss_choose
from specsweep.coerce import coerce_to_schema
from specsweep.methods import expand_methods
from specsweep.modelling.acceptance import model_drafter_family
from specsweep.modelling.profiles import profiles as sim_profile_set
from specsweep.sections import sampling_text
from specsweep.canon import canonical_json, package_digest

with open(workflow.source_path("../config/schema.yaml")) as _schema_file:
    _SCHEMA = yaml.load(_schema_file, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: 10x quicker

# Before anything copies or prints the configuration: each file read again with a duplicated key refused, and the
# merged values walked (their number bounded, NaN, infinity and NUL refused). Then --config values, which arrive as
# strings, are coerced to the schema's types, each engine's sim block is merged over the top-level one, validated
# (the error cut to its key and reason) and normalised.
try:
    for _path in workflow.configfiles:
        ss_config.read_config_file(_path)
    ss_config.check_values(config)
    config.update(ss_config.with_engine_sims(coerce_to_schema(dict(config), _SCHEMA)))
    try:
        validate(config, "../config/schema.yaml")
    except WorkflowError as _invalid:
        if not isinstance(_invalid.__context__, ValidationError):
            raise
        raise ss_config.ConfigError(ss_config.schema_error(_invalid.__context__)) from None
    # the cost model of each TP size: a matching calibration (results/calibration/) or the configured runtime
    CONFIG = ss_choose.resolve(ss_config.normalise(config), ss_choose.recorded_environment(config["backend"]))
    ss_config.check_engine_calibrations(CONFIG)  # each engine's, in its own view
except ss_config.ConfigError as _error:
    raise WorkflowError(f"Invalid configuration: {_error}") from None
# Servers start from an allowlisted environment (launcher.host_environment): a variable that changes decoding
# exported in the shell would reach none of them, nor any cell's key; refused before any job, naming it
try:
    launcher.check_host_environment()
except launcher.ServerError as _error:
    raise WorkflowError(f"Invalid environment: {_error}") from None

SERVERS = jobs.servers(CONFIG)

# A simulated host of sim.gpus GPUs: its server jobs count against its GPUs, not against --cores (server_threads),
# and Snakemake starts them in the plan's packing order as GPUs free: its `gpu` resource is the simulated host's
# GPU count, unless --resources gives one
SIMULATED_GPUS = jobs.simulated_gpus(CONFIG)
if SIMULATED_GPUS and workflow.is_main_process and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", SIMULATED_GPUS)

# What a valid configuration will not give (specsweep.config.warnings: no AR method, so no speedups), said once
if workflow.is_main_process:
    for _warning in ss_config.warnings(CONFIG):
        print(f"Warning: {_warning}", file=sys.stderr)

# One id per invocation, inherited by its jobs (here and on cluster nodes): journals are kept per run; a heartbeat
# file beside the cache tells cluster jobs the workflow is alive (runs.py).
if workflow.is_main_process:
    runs.start(f"{CONFIG['cache_dir']}/runs", CONFIG["server"]["orphan_timeout"])

# Snakemake's SIGTERM handler takes the scheduler's lock, which the main thread it interrupts may hold: run on that
# thread it deadlocks (runs.off_the_main_thread). Every Snakemake process of a run reads this file before its scheduler
# starts, the job step of a cancelled SLURM job (its batch shell killed, outside SLURM's reach) among them.
if not getattr(JobScheduler.exit_gracefully, "off_the_main_thread", False):
    JobScheduler.exit_gracefully = runs.off_the_main_thread(JobScheduler.exit_gracefully)


def all_cell_outputs():
    return [cell["path"] for cell in jobs.all_cells(CONFIG)]


def all_run_records():
    return [layout.run_record_path(s["tp"], s["method"], s["repetition"]) for s in SERVERS]


def forced(paths):
    """Mark ``paths`` to be made again in this run, as `--forcerun FILE` would: their job runs, and then everything
    downstream of them, for whichever target's DAG reaches them. Called from an input function while the main
    process builds its DAG (a cluster job runs the job it is given)."""
    if paths and workflow.is_main_process:
        files = getattr(workflow.dag, "forcefiles", None)
        if files is None:
            raise WorkflowError(f"this Snakemake version offers no way to make {paths[0]} again for this target: "
                                f"name it with --forcerun {paths[0]} ...")
        files.update(paths)


def rebuilt_when_missing(paths, unusable=None):
    """Input function: ``paths`` (a list, or one path), any of them that is missing (or for which ``unusable``, given
    the path, says why it cannot be used: the reason is printed) rebuilt for every target that reaches this rule.

    Snakemake (since 7.7) rebuilds a missing file only for a job that has to run anyway: with the tables and the
    report already there, a deleted cell, table or run record was restored for the default target alone, and
    `snakemake results/summary.csv` said "Nothing to be done". Marking the missing files as forced (see forced)
    rebuilds them for whichever target reaches the rule that reads them (so `snakemake plan` still starts
    nothing)."""

    def inputs(wildcards):
        listed = [paths] if isinstance(paths, str) else paths
        missing = [p for p in listed if not os.path.exists(p)]
        for path in [p for p in listed if p not in missing] if unusable else []:
            why = unusable(path)
            if why is not None:
                missing.append(path)
                if workflow.is_main_process:
                    print(f"{why}: made again", file=sys.stderr)
        forced(missing)
        return paths

    return inputs


def _repetition(wildcards):
    return int(wildcards.rep) if "rep" in wildcards.keys() else None


def server_job_settings(wildcards):
    """Everything one server's job depends on: its ServerJob, as plain values."""
    return jobs.server_job(CONFIG, int(wildcards.tp), wildcards.method, _repetition(wildcards)).as_dict()


def server_label(wildcards):
    """A server job's name: tp1/ar (tp1/ar/rep0 with repetitions)."""
    return layout.server_name(int(wildcards.tp), wildcards.method, _repetition(wildcards))


def server_job_summary(wildcards):
    """A server job at a glance, for its tracked param: tp1/ar (sim, Qwen3-8B, ar)."""
    job = jobs.server_job(CONFIG, int(wildcards.tp), wildcards.method, _repetition(wildcards))
    return f"{job.name} ({job.backend}, {job.model['name']}, {job.method.algorithm})"


def plan_gpus():
    """(GPUs the plan packs servers onto, where that number comes from): the simulated host's (sim.gpus), else
    gpu_pool.devices, else those visible here, else an 8-GPU host, said to be assumed (specsweep.gpus.plan_gpus)."""
    if SIMULATED_GPUS:
        return SIMULATED_GPUS, "from sim.gpus, the simulated host"
    return ss_gpus.plan_gpus(CONFIG["gpu_pool"]["devices"])


_PLAN_ROWS = []


def plan_rows():
    """The plan's predicted rows, one per cell (specsweep.plan.predict), computed once and only when a job needs
    them, and kept in the cache folder for later invocations of the same plan."""
    if not _PLAN_ROWS:
        from specsweep.plan import predict

        _PLAN_ROWS.extend(predict(CONFIG, CONFIG["cache_dir"]))
    return _PLAN_ROWS


def predicted_durations():
    """{server: (tp, seconds)} from the plan's cost model."""
    from specsweep.plan import server_durations

    return server_durations(plan_rows())


_SETTLED = {}


def settled_cost_model(wildcards):
    """Input function of the rules whose params price with the cost model (the server jobs, aggregation, the
    predictions, the report's data). With calibration.in_default_target they wait for the configuration's
    calibrations (calibrations_written: Snakemake makes these jobs once the calibrations this run makes or mends are
    written) and the cost model is chosen again from them, so that each cell is measured once, under the
    calibration it is reported with. Refuses while a calibration file found is broken (calibration.choose.broken),
    naming it: its TP size would otherwise be priced by the roofline, every cell measured again under it. Returns the
    calibration files waited for."""
    waited = []
    if CONFIG["calibration"]["in_default_target"]:
        waited = calibrations_written()  # rules/calibrate.smk
        if "chosen" not in _SETTLED:
            CONFIG["cost_model"] = ss_choose.choose(CONFIG, ss_choose.recorded_environment(CONFIG["backend"]))
            _SETTLED["chosen"] = True
    sound_calibrations(wildcards)
    return waited


def sound_calibrations(wildcards):
    """Input function (of the plan, and through settled_cost_model of every rule that prices): nothing, or a
    WorkflowError naming each calibration file found that cannot be read and what to do."""
    key = "broken, chosen again" if "chosen" in _SETTLED else "broken"
    if key not in _SETTLED:
        _SETTLED[key] = ss_choose.broken(engines.views(CONFIG))
    if _SETTLED[key]:
        raise WorkflowError("a calibration file is broken: " + "; ".join(_SETTLED[key]))
    return []


def plan_within_bound(wildcards):
    """Input function of the server jobs: settled_cost_model, then the plan's bound (specsweep.plan.plan_bound): a
    run whose calibrated plan is more than PLAN_BOUND times dearer than without calibration starts no job unless
    confirm_plan_hours allows it (the error names the calibration files and the key)."""
    waited = settled_cost_model(wildcards)
    if "bound" not in _SETTLED:
        from specsweep.plan import plan_bound

        _SETTLED["bound"] = plan_bound(CONFIG, CONFIG["cache_dir"])
    if _SETTLED["bound"] and _SETTLED["bound"]["problem"]:
        raise WorkflowError(f"Refused: {_SETTLED['bound']['problem']}")
    return waited


_PACKING = {}


def server_job_priority(wildcards):
    """Repetitions: the seeded random method order; otherwise the plan's packing order (see specsweep.plan), under
    budget: verdict AR's servers first, then the most uncertain verdicts (plan.verdict_priorities)."""
    rep = _repetition(wildcards)
    if rep is not None:
        return jobs.server_priority(CONFIG, int(wildcards.tp), wildcards.method, rep)
    if not _PACKING:
        from specsweep.plan import gpus_per_host, priorities, verdict_priorities

        gpus = plan_gpus()[0]
        _PACKING.update(
            priorities(predicted_durations(), gpus, CONFIG["gpu_pool"]["exclusive"], gpus_per_host(CONFIG, gpus))
        )
        if CONFIG["budget"] == "verdict":  # AR first, then the most uncertain verdicts (specsweep.plan)
            _PACKING.update(verdict_priorities(plan_rows(), CONFIG, dict(_PACKING)))
    return _PACKING.get(f"tp{wildcards.tp}/{wildcards.method}", 0)


def server_gpus(wildcards):
    """GPUs a server job holds: its TP size on GPU hosts and on a simulated GPU host (gpu_pool.devices, sim.gpus)."""
    pool = jobs.gpu_pool(CONFIG)
    if CONFIG["backend"] == "sglang" or pool["devices"]:
        return pool["devices"] if pool["exclusive"] else int(wildcards.tp)
    return 0


def server_threads(wildcards):
    """Cores a server job counts against --cores: none on the simulated host (sim.gpus), whose GPUs bound how many
    run at once (a simulated server mostly waits out its modelled steps: four of them and their clients used about
    a tenth of a core each on the default plan), one elsewhere."""
    return 0 if SIMULATED_GPUS else 1


# A job's settings reach it twice (specsweep.rerun). `settings`, tracked: a summary and their digest, which Snakemake
# compares with the one its outputs were made with (and prints, short, when it differs). The whole value under the
# rule's own name, from a function of `output`: Snakemake counts such a param as derived from the output files and
# neither tracks nor prints it. The main process keeps each value under its digest in SETTINGS_KEPT, beside
# Snakemake's own records, and says in one line per job what changed since its outputs were made.
SETTINGS_KEPT = os.path.join(".snakemake", "specsweep-settings")
_SAID = set()


def settings_params(name, settings_of, summary_of, label_of, by=None):
    """A rule's params for settings it depends on: {"settings": tracked, name: the whole value as canonical JSON}.
    ``settings_of``, ``summary_of`` and ``label_of`` take the wildcards (``summary_of`` a short text, ``label_of``
    the job's name in the line that says what changed); ``by``: the settings are {job: settings} of several jobs
    of that kind (rerun.change_line)."""

    def settings(wildcards):
        return rerun.tracked(summary_of(wildcards), settings_of(wildcards))

    def whole(wildcards, output):
        value = settings_of(wildcards)
        if workflow.is_main_process:
            say_what_changed(label_of(wildcards), value, list(output), by)
        return params_text(value)

    return {"settings": settings, name: whole}


def say_what_changed(label, value, outputs, by=None):
    """Once per job of this invocation: keep its settings (not in a dry run) and, where Snakemake reruns it because
    they changed (its outputs recorded with another digest), print what changed (rerun.change_line), the settings
    its outputs were made with read back by their digest."""
    if label in _SAID or workflow.persistence is None:  # None: no DAG of jobs is built (--lint, --list-rules)
        return
    _SAID.add(label)
    if not workflow.dryrun:
        rerun.keep(SETTINGS_KEPT, value)
    if RerunTrigger.PARAMS not in workflow.rerun_triggers:
        return
    files = [IOFile(path) for path in outputs]
    recorded = [
        workflow.persistence.params(file)
        for file in files
        if (workflow.persistence.record_format_version(file) or 0) >= 6  # as Snakemake reads them
    ]
    digests = {rerun.digest_in(params) for params in recorded if params is not None}
    now = rerun.settings_digest(value)
    if not digests or digests == {now}:
        return
    before = next((d for d in digests if d not in (now, None)), None)
    old = rerun.kept(SETTINGS_KEPT, before) if before else None
    if old is not None:
        line = rerun.change_line(label, old, value, by)
    elif before is None:
        line = f"{label}: settings recorded before they carried a digest: it runs once more"
    else:
        line = f"{label}: settings changed (those its outputs were made with are not kept here, in {SETTINGS_KEPT})"
    print(line, file=sys.stderr)


def params_text(value):
    """Canonical JSON for a rule's params. Snakemake reads {name} in a params string as a wildcard (a WildcardError,
    or silently the wildcard's value): a brace that would open one, in a title or a path from the configuration, is
    written as the JSON escape \\u007b, which reads back as the brace itself."""
    return re.sub(r"\{(?=\s*\w)", r"\\u007b", canonical_json(value))


def environment_params_json(engine=None):
    """What the environment depends on: the backend and, for SGLang, how it (an engine's build) is built; for external
    servers, the server jobs whose servers it describes (their URLs and methods)."""
    settings = {"backend": CONFIG["backend"]}
    if CONFIG["backend"] == "external":
        settings["servers"] = [job.as_dict() for job in jobs.external_servers(CONFIG)]
    if CONFIG["backend"] == "sglang":
        build = engines.view(CONFIG, engine)["sglang"]
        settings["sglang"] = {k: build[k] for k in ("python", "install", "build", "env_dir")}
    return params_text(settings)


def server_environment(wildcards):
    """The environment record a server job's engine runs in; on backend external made again in every run that reaches a
    server job (every server asked what it is now: its cells are keyed by that)."""
    if CONFIG["backend"] == "external":
        forced([layout.environment_path("external")])
    return rebuilt_when_missing(layout.environment_path(CONFIG["backend"], engines.split(wildcards.method)[1]))(
        wildcards
    )


def sim_profile_text():
    """What the simulated servers emulate, as the report prints it: model and GPU profiles, the runtime profile that
    priced their steps (a calibrated one is calibrated-tp<TP>), the drafter family whose acceptance they drew from
    (the model profile's drafter_family), and how fast their clock ran (sim.time_scale)."""
    runtimes = ", ".join(dict.fromkeys(ss_choose.sim_settings(CONFIG, tp)["runtime"] for tp in CONFIG["tp"]))
    family = model_drafter_family(sim_profile_set(CONFIG["sim"].get("profiles")), CONFIG["sim"]["model_profile"])
    text = f"{CONFIG['sim']['model_profile']} on {CONFIG['sim']['gpu']}, runtime {runtimes}, {family} drafters"
    scale = CONFIG["sim"]["time_scale"]
    if scale != 1:
        text += (f", on a clock run {scale:g} times fast (sim.time_scale: every duration measured here is about "
                 f"1/{scale:g} of the modelled one, every rate about {scale:g} times)")
    return text


def plan_profile_text():
    """The runtime profiles the plan priced with (a calibrated one is calibrated-tp<TP>), on which model and GPU."""
    settings = [ss_choose.sim_settings(CONFIG, tp) for tp in CONFIG["tp"]]
    runtimes = ", ".join(dict.fromkeys(s["runtime"] for s in settings))
    gpus = ", ".join(dict.fromkeys(s["gpu"] for s in settings))
    return f"{runtimes} ({CONFIG['sim']['model_profile']} on {gpus})"


def stage_costs():
    """{"<engine>|<tp>": the simulator's settings (its cost model)} of every engine and TP that runs a DDTree method:
    the DDTree stage table's modelled split of each measured round (specsweep.ddtree_profile.stage_rows)."""
    out = {}
    for engine in sorted({m.engine or "" for m in expand_methods(CONFIG) if m.spec.builds_trees}):
        view = engines.view(CONFIG, engine or None)
        for tp in CONFIG["tp"]:
            out[f"{engine}|{tp}"] = ss_choose.sim_settings(view, tp)
    return out


def report_view():
    """What the report's data depends on besides its input files."""
    view = {
        "title": CONFIG["report"]["title"],
        "author": CONFIG["report"]["author"],
        "model": CONFIG["model"]["name"],
        "methods": [m.name for m in expand_methods(CONFIG)],
        "warmup": CONFIG["warmup"],
        "warmup_fill": "all" if jobs.warmup_fills(CONFIG) else None,
        "load_model": CONFIG["load"]["model"],
        "sampling": sampling_text(CONFIG["sampling"], CONFIG["load"]),
        "sim_profile": sim_profile_text() if CONFIG["backend"] == "sim" else "",
        "plan_profile": plan_profile_text(),
        "cost_model": ss_choose.labels(CONFIG),
    }
    return view


wildcard_constraints:
    tp=r"\d+",
    method=r"[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9][A-Za-z0-9_.-]*)?",
    engine=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    backend="sim|sglang|external",
    rep=r"\d+",


# Package code changes do not rerun rules by themselves; these digests do for
# aggregation and the report (measurements are versioned by HARNESS_VERSION).
AGGREGATE_CODE = package_digest(
    "aggregate.py", "verdict.py", "cells.py", "metrics.py", "slo.py", "algorithms.py", "ddtree.py", "sequential.py"
)
REPORT_CODE = package_digest(
    "report.py",
    "verdict.py",
    "cache.py",
    "metrics.py",
    "slo.py",
    "algorithms.py",
    "templates/report.tex.j2",
    "templates/verdict.tex.j2",
)
# an environment record is probed again when the code that probes it changes (its identity, which every cell key
# holds, is that code's account of the build)
ENVIRONMENT_CODE = package_digest("environment.py")
