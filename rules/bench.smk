# One job per server (tp, method[, repetition]); its outputs are all of that server's cells.
REP = "-r{rep}" if CONFIG["repetitions"] > 1 else ""


rule bench_server:
    input:
        environment=f"results/env/{CONFIG['backend']}.json",
        method_checked="results/env/methods/{method}.json",
    output:
        [
            f"results/cells/tp{{tp}}/{{method}}/{w['name']}/c{c}{REP}.json"
            for w in CONFIG["workloads"]
            for c in CONFIG["concurrency"]
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
