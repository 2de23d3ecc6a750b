from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
from pathlib import Path

from specsweep.calibration.run import calibrate
from specsweep.runs import stop_with_workflow

stop_with_workflow()  # Snakemake killed outright: stop the server, leave no orphan

calibrate(
    json.loads(snakemake.params.job),
    json.loads(Path(snakemake.input.environment).read_text()),
    snakemake.output.profile,
    snakemake.output.table,
    Path(snakemake.log[0]).parent,
)
