# Build or verify the server environment and record what it is and can do (one per engine where `engines` names
# several builds: results/env/sglang@<engine>.json).
rule environment:
    output:
        layout.environment_path("{backend}"),
    params:
        backend=lambda wildcards: wildcards.backend,
        settings=lambda wildcards: environment_params_json(),
        code=ENVIRONMENT_CODE,
    log:
        "logs/environment-{backend}.log",
    script:
        "../scripts/environment.py"


rule engine_environment:
    output:
        layout.environment_path("{backend}", "{engine}"),
    params:
        backend=lambda wildcards: wildcards.backend,
        settings=lambda wildcards: environment_params_json(wildcards.engine),
        code=ENVIRONMENT_CODE,
    log:
        "logs/environment-{backend}@{engine}.log",
    script:
        "../scripts/environment.py"
