rule environment:
    output:
        "results/env/{backend}.json",
    params:
        backend=lambda wildcards: wildcards.backend,
    log:
        "logs/environment-{backend}.log",
    script:
        "../scripts/environment.py"
