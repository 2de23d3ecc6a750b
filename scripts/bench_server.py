from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys
from pathlib import Path

from specsweep.cells import bench_server

result = bench_server(
    params=json.loads(snakemake.params.server),
    outputs=list(snakemake.output),
    environment=json.loads(Path(snakemake.input.environment).read_text()),
    log_dir=Path(snakemake.log[0]).parent,
    journal_path=snakemake.params.journal,
)
print(f"cells from cache: {result['hits']}, measured: {result['measured']}", file=sys.stderr)
