# Build or verify the server environment and record what it is and can do.
rule environment:
    output:
        layout.environment_path("{backend}"),
    params:
        backend=lambda wildcards: wildcards.backend,
        settings=environment_params_json(),
    log:
        "logs/environment-{backend}.log",
    script:
        "../scripts/environment.py"
