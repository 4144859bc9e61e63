"""Conversion: ONNX export, INT8 quantization, FP16 conversion, the checks every written ONNX file
goes through, a user's input convention and pre-checks."""
