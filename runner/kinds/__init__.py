"""Measurement kinds: one module (or subpackage) each, listed in runner.kinds.registry; the
tables and helpers several kinds share are in runner.kinds.shared."""
