from specsweep.logs import to_log

to_log(snakemake.log[0])

from pathlib import Path

from specsweep.aggregate import write_tables

write_tables(list(snakemake.input.cells), Path(snakemake.output.summary).parent)
