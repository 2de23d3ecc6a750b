from specsweep.plan import NOT_PRICED

# `snakemake plan`: what the configured plan costs, before anything runs (no server is started). It marks the
# cells already in the cell cache once the environment is there (then a declared input); the cache itself lies
# outside the DAG by design, so `snakemake plan --forcerun plan` refreshes those marks after a run.
rule plan:
    input:
        environment=lambda wildcards: [p for p in [layout.environment_path(CONFIG["backend"])] if os.path.exists(p)],
        calibrations=sound_calibrations,  # a broken calibration file stops the plan too, naming it (common.smk)
    output:
        md="results/plan/plan.md",
        csv="results/plan/plan.csv",
    params:
        # the whole configuration: tracked by its digest (`settings`), read whole as `config` (common.smk)
        **settings_params("config", lambda wildcards: CONFIG, lambda wildcards: "the plan", lambda wildcards: "plan"),
        gpus=plan_gpus()[0],
        gpus_from=plan_gpus()[1],  # plan.md says where the number comes from
    log:
        "logs/plan.log",
    script:
        "../scripts/plan.py"


# The plan's predicted seconds per cell (a pure function of the configuration and its cost models), each server's
# start-up cold or warm as the packing starts it, which the report's appendix compares with each server's latest run.
rule predictions:
    input:
        calibrations=settled_cost_model,  # the cost model the cells had (common.smk)
    output:
        layout.PREDICTIONS,
    params:
        **settings_params(
            "config",
            lambda wildcards: {k: v for k, v in CONFIG.items() if k not in NOT_PRICED},
            lambda wildcards: "the priced configuration",
            lambda wildcards: "predictions",
        ),
        gpus=plan_gpus()[0],
    log:
        "logs/predictions.log",
    script:
        "../scripts/predictions.py"
