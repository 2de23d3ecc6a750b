from specsweep.logs import to_log

to_log(snakemake.log[0])

from specsweep.report import build_report

build_report(snakemake.input.data, snakemake.output.pdf, log_path=snakemake.log[0] + ".latexmk")
