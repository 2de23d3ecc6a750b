from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys
from pathlib import Path

from specsweep.bench import bench_server, remeasured_outputs
from specsweep.jobs import verdict_reference_method
from specsweep.calibration.choose import resolve
from specsweep.config import normalise
from specsweep.server_job import ServerJob
from specsweep.methods import expand_methods
from specsweep.plan import predict_server
from specsweep.runs import stop_with_workflow

stop_with_workflow()  # Snakemake killed outright (here or on a login node): stop the server, leave no orphan

job = ServerJob.from_dict(json.loads(snakemake.params.job))
# every configured method on this job's engine (its build), for the capability check (from the validated config, not
# a rerun trigger)
all_methods = [m for m in expand_methods(snakemake.config) if m.engine == job.method.engine]


def plan_config() -> dict:
    """The configuration as the plan reads it: normalised (sim.runtime auto resolved, methods expanded) and its cost
    models chosen (on the sglang backend, for the environment measured)."""
    return resolve(normalise(snakemake.config), environment if job.backend == "sglang" else None)


def planned(sessions: dict) -> dict | None:
    """The plan's seconds per cell, for the progress lines' time left (from the config, not a rerun trigger)."""
    try:
        config = plan_config()
        rows = predict_server(config, job.tp, job.method.name, job.repetition, sessions)
    except Exception as exc:  # progress lines then go without a time estimate
        print(f"no time estimate from the plan ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None
    return {row["path"]: row["warmup_s"] + row["measure_s"] for row in rows}


def predicted_speedups() -> dict:
    """Under budget: verdict, the cost model's speedup of each cell over AR's ({(workload, concurrency): AR's
    predicted seconds / this method's}) for the implied-slower rule (from the config, not a rerun trigger)."""
    if job.budget is None:
        return {}
    try:
        config = plan_config()
        ar = verdict_reference_method(config, job.method)
        seconds = [
            {
                (r["workload"], r["concurrency"]): r["measure_s"]
                for r in predict_server(config, job.tp, name, job.repetition)
            }
            for name in (ar.name, job.method.name)
        ]
    except Exception as exc:  # no prediction: no cell is implied slower
        print(f"no speedup predicted by the plan ({type(exc).__name__}: {exc})", file=sys.stderr)
        return {}
    return {cell: seconds[0][cell] / seconds[1][cell] for cell in seconds[1] if seconds[1][cell] > 0}


environment = json.loads(Path(snakemake.input.environment).read_text())
result = bench_server(
    job=job,
    outputs=list(snakemake.output.cells),
    environment=environment,
    log_dir=Path(snakemake.log[0]).parent,
    run_record=snakemake.output.run,
    all_methods=all_methods,
    planned=planned,
    failures=json.loads(snakemake.params.failures),
    # the cells `--config remeasure=<globs>` names (the workflow makes the job run for them: not a rerun trigger)
    remeasure=remeasured_outputs(snakemake.config["remeasure"], list(snakemake.output.cells)),
    # budget: verdict: AR's cells of this TP, which this server's cells stop against (measured first: an input)
    reference=list(snakemake.input.reference),
    predicted=predicted_speedups(),
    family=list(snakemake.input.family),
)
print(
    f"cells from cache: {result['hits']}, measured: {result['measured']}, not measured: {result['skipped']}"
    + (f", not final: {', '.join(result['not_final'])}" if result["not_final"] else ""),
    file=sys.stderr,
)
