rule aggregate:
    input:
        cells=all_cell_outputs(),
    output:
        summary="results/summary.csv",
    params:
        code=AGGREGATE_CODE,
    log:
        "logs/aggregate.log",
    script:
        "../scripts/aggregate.py"
