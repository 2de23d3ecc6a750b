"""The embedded simulated backend: an SGLang-compatible server that emulates AR, DFlash, DDTree and every algorithm
of the registry, its steps and acceptance those of the model (specsweep.modelling)."""
