from specsweep.logs import to_log

to_log(snakemake.log[0])

import json

from specsweep.plan import write_predictions

write_predictions(json.loads(snakemake.params.config), snakemake.output[0], snakemake.params.gpus)
