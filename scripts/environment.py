from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys

from specsweep.canon import atomic_write_json
from specsweep.environment import prepare_python, probe

settings = json.loads(snakemake.params.settings)
python = prepare_python(settings["sglang"]) if settings["backend"] == "sglang" else sys.executable
environment = probe(settings["backend"], python)
if settings["backend"] == "sglang":
    environment["server"]["build"] = settings["sglang"].get("build")
atomic_write_json(snakemake.output[0], environment)
