"""Runtimes: one class per backend behind one interface (base.Runtime), each in a module of
its own; the registry (registry.py) names them and makes them by name. This package's own
module imports nothing, so a backend module importing its siblings is no circle."""
