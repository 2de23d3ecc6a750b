"""The embedded simulated backend: an SGLang-compatible server that emulates AR, DFlash and DDTree."""
