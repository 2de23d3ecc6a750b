from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys
from pathlib import Path

from specsweep.cells import bench_server
from specsweep.config import expand_methods

# every configured method, for the capability check (from the validated config, not a rerun trigger)
all_methods = [m.as_dict() for m in expand_methods(snakemake.config)]

result = bench_server(
    params=json.loads(snakemake.params.server),
    outputs=list(snakemake.output),
    environment=json.loads(Path(snakemake.input.environment).read_text()),
    log_dir=Path(snakemake.log[0]).parent,
    journal_path=snakemake.params.journal,
    all_methods=all_methods,
)
print(f"cells from cache: {result['hits']}, measured: {result['measured']}", file=sys.stderr)
