rule aggregate:
    input:
        cells=rebuilt_when_missing(all_cell_outputs()),
    output:
        summary=layout.table_path("summary"),
        tables=[
            layout.table_path(name, ext)
            for name in layout.TABLES
            for ext in ("csv", "parquet")
            if (name, ext) != ("summary", "csv")
        ],
    params:
        code=AGGREGATE_CODE,
    log:
        "logs/aggregate.log",
    script:
        "../scripts/aggregate.py"
