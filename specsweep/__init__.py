"""specsweep: benchmark speculative decoding (AR, DFlash, DDTree and every algorithm SGLang ships) in SGLang.

The package holds all logic of the workflow; the Snakefile, rules and scripts
only connect it to Snakemake.
"""

__version__ = "0.1.0"

# Part of every cell's key. It covers what is measured and how: how requests are sent, timed and recorded
# (client, HTTP reader, load models), how a server is launched and which records a cell keeps. Bump it when
# one of those changes: every cached cell becomes stale and is measured again. It does not cover formulas:
# every metric in a table is computed from a cell's records by the code of the day (metrics.cell_measures), so
# a changed definition needs no measurement and is never a reason to bump it.
# 3: streams read at the protocol level (chunk times at 256 streams were up to 20 ms late); 4: warm-up sessions
# of their own (a warm-up drawn from the measured prompts filled the prefix cache they then hit), HTTP framing by
# httptools, a request's t0 taken just before its bytes go out
HARNESS_VERSION = 4

# Version of the cell JSON layout (see specsweep/cell.schema.json).
CELL_SCHEMA_VERSION = 1
