# `snakemake plan`: what the configured plan costs, before anything runs (no server is started). It marks the
# cells already in the cell cache once the environment is there (then a declared input); the cache itself lies
# outside the DAG by design, so `snakemake plan --forcerun plan` refreshes those marks after a run.
rule plan:
    input:
        environment=lambda wildcards: [p for p in [layout.environment_path(CONFIG["backend"])] if os.path.exists(p)],
    output:
        md="results/plan/plan.md",
        csv="results/plan/plan.csv",
    params:
        config=lambda wildcards: canonical_json(CONFIG),
        gpus=plan_gpus(),
    log:
        "logs/plan.log",
    script:
        "../scripts/plan.py"


# The plan's predicted seconds per cell (a pure function of the configuration and its cost models), each server's
# start-up cold or warm as the packing starts it, which the report's appendix compares with each server's latest run.
rule predictions:
    output:
        layout.PREDICTIONS,
    params:
        config=lambda wildcards: canonical_json(
            {k: v for k, v in CONFIG.items() if k not in ("report", "failures", "remeasure")}
        ),
        gpus=plan_gpus(),
    log:
        "logs/predictions.log",
    script:
        "../scripts/predictions.py"
