from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
import sys

from specsweep import external
from specsweep.canon import atomic_write_json
from specsweep.environment import prepare_python, probe
from specsweep.server_job import ServerJob

settings = json.loads(snakemake.params.settings)
if settings["backend"] == "sglang":
    python, pins = prepare_python(settings["sglang"])
    environment = probe("sglang", python, pins=pins, build=settings["sglang"].get("build"))
elif settings["backend"] == "external":  # every server checked against its method before any bench job
    environment = probe("external", sys.executable)
    environment["servers"] = external.describe_servers(
        environment, [ServerJob.from_dict(s) for s in settings["servers"]]
    )
else:
    environment = probe("sim", sys.executable)
atomic_write_json(snakemake.output[0], environment)
