from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
from pathlib import Path

from specsweep.calibrate import fingerprints
from specsweep.canon import atomic_write_json

environment = json.loads(Path(snakemake.input.environment).read_text())
atomic_write_json(snakemake.output[0], fingerprints(environment, json.loads(snakemake.params.config)))
