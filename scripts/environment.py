from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys

from specsweep.canon import atomic_write_json
from specsweep.environment import prepare_python, probe

settings = json.loads(snakemake.params.settings)
if settings["backend"] == "sglang":
    python, pins = prepare_python(settings["sglang"])
    environment = probe("sglang", python, pins=pins, build=settings["sglang"].get("build"))
else:
    environment = probe("sim", sys.executable)
atomic_write_json(snakemake.output[0], environment)
