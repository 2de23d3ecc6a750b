"""specsweep: benchmark speculative decoding (AR, DFlash, DDTree and every algorithm SGLang ships) in SGLang.

The package holds all logic of the workflow; the Snakefile, rules and scripts
only connect it to Snakemake.
"""

__version__ = "0.1.0"

# Bump when the meaning of a measurement changes: every cached cell becomes
# stale and is measured again.
HARNESS_VERSION = 3  # 3: streams read at the protocol level (chunk times at 256 streams were up to 20 ms late)

# Version of the cell JSON layout (see specsweep/cell.schema.json).
CELL_SCHEMA_VERSION = 1
