# `snakemake plan`: what the configured plan costs, before anything runs (no server is started).
rule plan:
    output:
        md="results/plan/plan.md",
        csv="results/plan/plan.csv",
    params:
        config=lambda wildcards: canonical_json(CONFIG),
        gpus=plan_gpus(),
        environment=f"results/env/{CONFIG['backend']}.json",
    log:
        "logs/plan.log",
    script:
        "../scripts/plan.py"
