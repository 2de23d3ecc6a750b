# Build or verify the server environment and record what it is and can do.
rule environment:
    output:
        "results/env/{backend}.json",
    params:
        backend=lambda wildcards: wildcards.backend,
        settings=environment_params_json(),
    log:
        "logs/environment-{backend}.log",
    script:
        "../scripts/environment.py"
