def report_category(section):
    """A report section's category in Snakemake's HTML report: its number and title, in the PDF's order."""
    return f"{list(layout.REPORT_SECTIONS).index(section) + 1} {layout.REPORT_SECTIONS[section]}"


# report_data writes the one file both report rules read (every chart's and table's CSV text and the template's
# context); report_pdf renders and compiles the LaTeX, report_figures draws the same charts for the HTML report.
rule report_data:
    input:
        tables=rebuilt_when_missing([layout.table_path(name) for name in layout.TABLES]),
        environment=rebuilt_when_missing(layout.environment_path(CONFIG["backend"])),
        predictions=rebuilt_when_missing(layout.PREDICTIONS),
        runs=rebuilt_when_missing(all_run_records()),
        calibrations=settled_cost_model,  # the cost model the report names, as the cells had it (common.smk)
    output:
        layout.REPORT_DATA,
    params:
        **settings_params(
            "view", lambda wildcards: report_view(), lambda wildcards: "the report", lambda wildcards: "report_data"
        ),
        code=REPORT_CODE,
    log:
        "logs/report_data.log",
    script:
        "../scripts/report_data.py"


rule report_pdf:
    input:
        data=rebuilt_when_missing(layout.REPORT_DATA),
    output:
        pdf=report(
            "results/report/report.pdf",
            caption="report/report_pdf.rst",
            category="Report",
        ),
    params:
        code=REPORT_CODE,
    log:
        "logs/report_pdf.log",
    script:
        "../scripts/report_pdf.py"


rule report_figures:
    input:
        data=rebuilt_when_missing(layout.REPORT_DATA),
    output:
        **{
            section: report(
                directory(f"results/report/figures/{section}"),
                patterns=["{name}.png"],
                caption=f"report/{section}.rst",
                category=report_category(section),
            )
            for section, title in layout.REPORT_SECTIONS.items()
        },
    params:
        code=REPORT_CODE,
    log:
        "logs/report_figures.log",
    script:
        "../scripts/report_figures.py"


# the verdict (page 1 of the PDF) as one page of the HTML report: the stamp, the verdict table, the heatmap
rule report_verdict:
    input:
        data=rebuilt_when_missing(layout.REPORT_DATA),
    output:
        report(
            layout.VERDICT_HTML,
            caption="report/verdict_page.rst",
            category=report_category("verdict"),
        ),
    params:
        code=REPORT_CODE,
    log:
        "logs/report_verdict.log",
    script:
        "../scripts/report_verdict.py"
