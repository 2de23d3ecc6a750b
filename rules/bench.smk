# One job per server (tp, method[, repetition]); its outputs are all of that server's cells.
# Each job first checks every configured method against the installed server's
# capabilities, so a method the build cannot run stops the workflow before any
# server starts; jobs start in the plan's packing order (priority).
REP = "-r{rep}" if CONFIG["repetitions"] > 1 else ""


rule bench_server:
    input:
        environment=f"results/env/{CONFIG['backend']}.json",
    output:
        [
            f"results/cells/tp{{tp}}/{{method}}/{w['name']}/c{c}{REP}.json"
            for w in CONFIG["workloads"]
            for c in ss_config.workload_concurrency(CONFIG, w)
        ],
    params:
        server=server_params_json,
        journal="results/journal.jsonl",
    resources:
        gpu=server_gpus,
    priority: server_job_priority
    log:
        f"logs/bench/tp{{tp}}-{{method}}{REP}.log",
    script:
        "../scripts/bench_server.py"
