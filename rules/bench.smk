# One job per server (tp, method[, repetition]); its outputs are all of that server's cells and its run record.
# Each job first checks every configured method against the installed server's
# capabilities, so a method the build cannot run stops the workflow before any
# server starts; jobs start in the plan's packing order (priority).
REP = "{rep}" if CONFIG["repetitions"] > 1 else None


rule bench_server:
    input:
        environment=rebuilt_when_missing(layout.environment_path(CONFIG["backend"])),
    output:
        cells=[
            layout.cell_path("{tp}", "{method}", w["name"], c, REP)
            for w in CONFIG["workloads"]
            for c in jobs.workload_concurrency(CONFIG, w)
        ],
        run=layout.run_record_path("{tp}", "{method}", REP),
    params:
        job=server_job_json,
    resources:
        gpu=server_gpus,
    priority: server_job_priority
    log:
        layout.bench_log_path("{tp}", "{method}", REP),
    script:
        "../scripts/bench_server.py"
