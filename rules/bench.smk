# One job per server (tp, method); its outputs are all of that server's cells.
rule bench_server:
    input:
        environment=f"results/env/{CONFIG['backend']}.json",
        method_checked="results/env/methods/{method}.json",
    output:
        [
            ss_config.cell_path("{tp}", "{method}", w["name"], c, r)
            for w in CONFIG["workloads"]
            for c in CONFIG["concurrency"]
            for r in range(CONFIG["repetitions"])
        ],
    params:
        server=server_params_json,
        journal="results/journal.jsonl",
    resources:
        gpu=server_gpus,
    log:
        "logs/bench/tp{tp}-{method}.log",
    script:
        "../scripts/bench_server.py"
