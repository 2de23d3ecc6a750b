# Every cell of the configuration, verified against it (key, prompts, digest, schema), into the tables.
rule aggregate:
    input:
        cells=rebuilt_when_missing(all_cell_outputs()),
        environment=[layout.environment_path(CONFIG["backend"], e) for e in engines.names(CONFIG) or [None]],
        calibrations=settled_cost_model,  # the cells' cost model, as their server jobs had it (common.smk)
    output:
        summary=layout.table_path("summary"),
        tables=[
            layout.table_path(name, ext)
            for name in layout.TABLES
            for ext in ("csv", "parquet")
            if (name, ext) != ("summary", "csv")
        ],
    params:
        # every server job's settings by name: tracked by their digest (`settings`), read whole as `jobs`
        **settings_params(
            "jobs",
            lambda wildcards: {
                layout.server_name(s["tp"], s["method"], s["repetition"]): jobs.server_job(
                    CONFIG, s["tp"], s["method"], s["repetition"]
                ).as_dict()
                for s in SERVERS
            },
            lambda wildcards: f"{len(SERVERS)} server jobs",
            lambda wildcards: "aggregate",
            by="server job",
        ),
        failures=canonical_json(CONFIG["failures"]),
        # analysis only, in no cell's key: an edit aggregates again and measures nothing
        slo=canonical_json(CONFIG["slo"]),
        engines=canonical_json(engines.names(CONFIG)),
        # the simulator's cost model of each engine and TP, which the DDTree stage table prices the same rounds with
        stage_costs=canonical_json(stage_costs()),
        code=AGGREGATE_CODE,
    log:
        "logs/aggregate.log",
    script:
        "../scripts/aggregate.py"
