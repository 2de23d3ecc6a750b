# One job per server (tp, method[, repetition]); its outputs are all of that server's cells and its run record.
# Each job first checks every configured method against the installed server's
# capabilities, so a method the build cannot run stops the workflow before any
# server starts; jobs start in the plan's packing order (priority).
from snakemake.logging import logger

from specsweep import bench

REP = "{rep}" if CONFIG["repetitions"] > 1 else None

if CONFIG["remeasure"] and not bench.remeasured_outputs(CONFIG["remeasure"], all_cell_outputs()):
    raise WorkflowError(
        f"remeasure: '{CONFIG['remeasure']}' names no cell of this configuration; give globs of cell names such "
        "as tp1/ar/short/c4, tp1/ar/* or */c16 (comma-separated), or cell paths"
    )


def server_cell_outputs(wildcards):
    """This server job's cell outputs."""
    cells = jobs.cells_of_server(CONFIG, int(wildcards.tp), wildcards.method, _repetition(wildcards))
    return [c["path"] for c in cells]


def verdict_reference(wildcards):
    """Under budget: verdict, AR's cell outputs at this server's TP (jobs.verdict_reference_cells): a DAG edge, so
    that AR's server is measured before the speculative servers whose cells stop against its cells; none
    otherwise (budget: exhaustive runs every server at once)."""
    return jobs.verdict_reference_cells(CONFIG, int(wildcards.tp), wildcards.method, _repetition(wildcards))


def verdict_family(wildcards):
    """Under budget: verdict, above the smallest TP: the smallest TP's cells of every setting of this server's
    algorithm (jobs.verdict_family_cells), which decide where it is dominated: a DAG edge; none otherwise."""
    return jobs.verdict_family_cells(CONFIG, int(wildcards.tp), wildcards.method, _repetition(wildcards))


def remeasured_cells(wildcards):
    """No input: the cells of this server that `--config remeasure=<globs>` names, made again in every run that
    gives it (forced, as --forcerun would), not only in the first: a request, not a setting whose change reruns."""
    forced(bench.remeasured_outputs(CONFIG["remeasure"], server_cell_outputs(wildcards)))
    return []


def say_what_remeasure_did():
    """The run's last line when `remeasure` names cells: how many of them this run measured (its journals)."""
    if CONFIG["remeasure"] and workflow.is_main_process:
        journals = [
            layout.journal_path(CONFIG["cache_dir"], s["tp"], s["method"], s["repetition"], runs.current())
            for s in SERVERS
        ]
        logger.info(bench.remeasure_summary(bench.remeasured_outputs(CONFIG["remeasure"], all_cell_outputs()), journals))


onsuccess:
    say_what_remeasure_did()


onerror:
    say_what_remeasure_did()


rule bench_server:
    input:
        environment=server_environment,
        remeasured=remeasured_cells,
        reference=verdict_reference,
        family=verdict_family,
        # a broken calibration, or a plan past its bound, starts no job; with calibration.in_default_target, the
        # calibrations first (common.smk)
        calibrations=plan_within_bound,
    output:
        cells=[
            layout.cell_path("{tp}", "{method}", w["name"], c, REP)
            for w in CONFIG["workloads"]
            for c in jobs.workload_concurrency(CONFIG, w)
        ],
        run=layout.run_record_path("{tp}", "{method}", REP),
    params:
        # the job's ServerJob: tracked by its digest (`settings`), read whole as `job` (common.smk)
        **settings_params("job", server_job_settings, server_job_summary, server_label),
        failures=canonical_json(CONFIG["failures"]),
        # cells whose output is there though they were not final (failures.keep_going): measured again next run
        unfinished=lambda wildcards: canonical_json(bench.unfinished_outputs(server_cell_outputs(wildcards))),
    threads: server_threads
    resources:
        gpu=server_gpus,
    priority: server_job_priority
    log:
        layout.bench_log_path("{tp}", "{method}", REP),
    script:
        "../scripts/bench_server.py"
