from specsweep.logs import to_log

to_log(snakemake.log[0])

from specsweep.report import write_verdict_html

write_verdict_html(snakemake.input.data, snakemake.output[0])
