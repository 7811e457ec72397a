"""PT2E quantization: quantizers annotate a program, prepare places observers, calibration runs them, convert
writes the reference quantized program (quantize/dequantize ops around float ops)."""
