REPORT_INPUTS = {
    "tables": [f"results/{name}.csv" for name in TABLES],
    "environment": f"results/env/{CONFIG['backend']}.json",
}


rule report_pdf:
    input:
        **REPORT_INPUTS,
    output:
        pdf=report(
            "results/report/report.pdf",
            caption="report/report_pdf.rst",
            category="Report",
        ),
    params:
        view=report_params_json,
        code=REPORT_CODE,
    log:
        "logs/report_pdf.log",
    script:
        "../scripts/report_pdf.py"


rule report_figures:
    input:
        **REPORT_INPUTS,
    output:
        **{
            section: report(
                directory(f"results/report/figures/{section}"),
                patterns=["{name}.png"],
                caption=f"report/{section}.rst",
                category=title,
            )
            for section, title in REPORT_SECTIONS.items()
        },
    params:
        view=report_params_json,
        code=REPORT_CODE,
    log:
        "logs/report_figures.log",
    script:
        "../scripts/report_figures.py"
