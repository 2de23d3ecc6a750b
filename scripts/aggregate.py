from specsweep.logs import to_log

to_log(snakemake.log[0])

from specsweep.aggregate import summarise_cells
from specsweep.canon import atomic_write_text

frame = summarise_cells(list(snakemake.input.cells))
atomic_write_text(snakemake.output.summary, frame.to_csv(index=False))
