from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
from pathlib import Path

from specsweep.canon import atomic_write_json
from specsweep.environment import check_methods

method = json.loads(snakemake.params.method)
check_methods([method], json.loads(Path(snakemake.input.environment).read_text()))
atomic_write_json(snakemake.output[0], {"method": method["name"], "checked": True})
