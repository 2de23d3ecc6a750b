from specsweep.logs import to_log

to_log(snakemake.log[0])

from specsweep.canon import atomic_write_json
from specsweep.environment import probe

atomic_write_json(snakemake.output[0], probe(snakemake.params.backend))
