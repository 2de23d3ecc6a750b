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


# Each configured method against the installed server's capabilities. Checks run
# before any bench job (priority), and each bench job waits for its method's check,
# so a method the build cannot run fails the workflow before its server starts.
rule check_method:
    input:
        environment=f"results/env/{CONFIG['backend']}.json",
    output:
        "results/env/methods/{method}.json",
    params:
        method=method_params_json,
    priority: 1000000
    log:
        "logs/check_method/{method}.log",
    script:
        "../scripts/check_method.py"
