from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
from pathlib import Path

from specsweep.report import plot_figures

plot_figures(str(Path(snakemake.input.tables[0]).parent), snakemake.input.environment,
             json.loads(snakemake.params.view), dict(snakemake.output.items()))
