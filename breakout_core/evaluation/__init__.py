"""Evaluation: policies (random, a checkpoint, an ONNX file), games on fixed seeds, fixed states
captured from an agent's games."""
