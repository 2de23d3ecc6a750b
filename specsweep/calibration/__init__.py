"""Calibration: the simulator's cost model measured on the user's own engine and GPUs, and which one a run uses.

- ``choose``: which calibration file prices each TP size of a configuration (``sim.calibration``), what it is
  called in plan.md, the cells and the report, and the fingerprint that names a calibration's files;
- ``probe``: the shapes measured through a running server's HTTP API (decode and verify steps, prefill, first
  token);
- ``fit``: the runtime profile fitted to the measured shapes (least squares);
- ``run``: one TP's calibration (``snakemake calibrate``): its servers started and stopped within the time bound,
  their measurements cached, the fit and its table written.

A calibration that cannot be read or made raises errors.CalibrationError.
"""
