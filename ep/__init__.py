"""ep: an execution provider in the shape of ONNX Runtime's, running on the simulated NPU."""
