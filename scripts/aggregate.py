from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys
from pathlib import Path

from specsweep import ddtree, external
from specsweep.aggregate import AggregateError, skipped_cells, verified_cells, write_tables
from specsweep.server_job import ServerJob
from specsweep.slo import Slo

ddtree.define(snakemake.config.get("ddtree_builds"))  # the configuration's own DDTree builds, by name

jobs = [ServerJob.from_dict(job) for job in json.loads(snakemake.params.jobs).values()]  # {server: its job}
engines = json.loads(snakemake.params.engines)  # the configured engines' names, in order (none: one engine)
environments = {
    engine: json.loads(Path(path).read_text()) for engine, path in zip(engines or [None], snakemake.input.environment)
}
identity = external.identities(environments)  # each engine's, and each external server's (describe_servers)
failures = json.loads(snakemake.params.failures)
try:
    cells = verified_cells(list(snakemake.input.cells), jobs, identity, failures)
except AggregateError as exc:
    sys.exit(f"aggregate: {exc}")
slo = Slo.from_config(json.loads(snakemake.params.slo))
stage_costs = json.loads(snakemake.params.stage_costs)  # the cost models beside DDTree's stage records
write_tables(
    cells,
    Path(snakemake.output.summary).parent,
    failures,
    engines,
    environments,
    slo,
    skipped=skipped_cells(list(snakemake.input.cells)),
    stage_costs=stage_costs,
)
