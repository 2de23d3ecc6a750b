from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
from pathlib import Path

from specsweep.calibration.run import fingerprints
from specsweep.canon import atomic_write_json

# each calibrated engine's environment record (None: the one build of a configuration without engines)
environments = {
    engine: json.loads(Path(path).read_text())
    for engine, path in zip(json.loads(snakemake.params.engines), snakemake.input.environments)
}
atomic_write_json(snakemake.output[0], fingerprints(environments, json.loads(snakemake.params.config)))
