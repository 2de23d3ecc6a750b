# specsweep: benchmark speculative decoding (AR, DFlash, DDTree and every algorithm SGLang ships) in SGLang.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "rules/report/workflow.rst"


include: "rules/common.smk"
include: "rules/environment.smk"
include: "rules/bench.smk"
include: "rules/aggregate.smk"
include: "rules/report.smk"
include: "rules/plan.smk"


# On a cluster these run where Snakemake runs, not as jobs: seconds of CPU each, no GPU (TeX for the PDF is
# needed there). The environment probe and the servers are jobs, on the GPU nodes.
localrules:
    all,
    aggregate,
    plan,
    predictions,
    report_data,
    report_pdf,
    report_figures,
    report_verdict,


rule all:
    input:
        all_cell_outputs(),
        layout.table_path("summary"),
        "results/report/report.pdf",
        layout.VERDICT_HTML,
        expand("results/report/figures/{section}", section=layout.REPORT_SECTIONS),

include: "rules/calibrate.smk"
