"""Learning: the Q-networks, replay, the trainer and its settings."""
