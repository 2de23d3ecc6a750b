TABLES = ["summary", "combined", "requests", "turns", "best_budget", "break_even", "pareto"]


rule aggregate:
    input:
        cells=all_cell_outputs(),
    output:
        summary="results/summary.csv",
        tables=[f"results/{name}.{ext}" for name in TABLES for ext in ("csv", "parquet") if (name, ext) != ("summary", "csv")],
    params:
        code=AGGREGATE_CODE,
    log:
        "logs/aggregate.log",
    script:
        "../scripts/aggregate.py"
