"""The engine: Breakout contract, environments, Q-networks, policies, evaluator, statistics.

This package never imports `runner`: it takes plain arguments and returns plain records,
so it can be used from a notebook without specs or a database.
"""
