from specsweep.logs import to_log

to_log(snakemake.log[0])

from specsweep.report import plot_throughput

plot_throughput(snakemake.input.summary, snakemake.output.png)
