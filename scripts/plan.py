from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys
from pathlib import Path

from specsweep.plan import write_plan

environment = json.loads(Path(snakemake.input.environment[0]).read_text()) if snakemake.input.environment else None
result = write_plan(
    json.loads(snakemake.params.config),
    environment,
    snakemake.params.gpus,
    snakemake.output.md,
    snakemake.output.csv,
    snakemake.params.gpus_from,
)
print(Path(snakemake.output.md).read_text(), file=sys.stderr)
