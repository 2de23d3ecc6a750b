from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
from pathlib import Path

from specsweep.report import write_report_data

write_report_data(
    Path(snakemake.input.tables[0]).parent,
    snakemake.input.environment,
    json.loads(snakemake.params.view),
    snakemake.input.predictions,
    list(snakemake.input.runs),
    snakemake.output[0],
)
