rule aggregate:
    input:
        cells=all_cell_outputs(),
    output:
        summary="results/summary.csv",
    log:
        "logs/aggregate.log",
    script:
        "../scripts/aggregate.py"
