"""Diagnosis: parity of Q-values, latency timing, layer-by-layer localisation and the repair
search."""
