"""The game: the contract (every rule of the environment as the agent sees it), the emulator's
preprocessing, the one episode driver and its worker process."""
