from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys
from pathlib import Path

from specsweep.aggregate import AggregateError, verified_cells, write_tables
from specsweep.jobs import ServerJob

jobs = [ServerJob.from_dict(job) for job in json.loads(snakemake.params.jobs)]
environment = json.loads(Path(snakemake.input.environment).read_text())
failures = json.loads(snakemake.params.failures)
try:
    cells = verified_cells(list(snakemake.input.cells), jobs, environment["identity_digest"], failures)
except AggregateError as exc:
    sys.exit(f"aggregate: {exc}")
write_tables(cells, Path(snakemake.output.summary).parent, failures)
