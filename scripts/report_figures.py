from specsweep.logs import to_log

to_log(snakemake.log[0])

from specsweep.report import plot_figures

plot_figures(snakemake.input.data, dict(snakemake.output.items()))
