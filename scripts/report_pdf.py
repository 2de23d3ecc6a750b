from specsweep.logs import to_log

to_log(snakemake.log[0])

import json
from pathlib import Path

from specsweep.report import build_report

build_report(str(Path(snakemake.input.tables[0]).parent), snakemake.input.environment,
             json.loads(snakemake.params.view), snakemake.output.pdf, log_path=snakemake.log[0] + ".latexmk")
