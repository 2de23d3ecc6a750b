rule report_pdf:
    input:
        summary="results/summary.csv",
        environment=f"results/env/{CONFIG['backend']}.json",
    output:
        pdf=report(
            "results/report/report.pdf",
            caption="report/report_pdf.rst",
            category="Report",
        ),
    params:
        view=report_params_json(),
        code=REPORT_CODE,
    log:
        "logs/report_pdf.log",
    script:
        "../scripts/report_pdf.py"


rule plot_throughput:
    input:
        summary="results/summary.csv",
    output:
        png=report(
            "results/report/throughput.png",
            caption="report/throughput.rst",
            category="Throughput",
        ),
    params:
        code=REPORT_CODE,
    log:
        "logs/plot_throughput.log",
    script:
        "../scripts/plot_throughput.py"
