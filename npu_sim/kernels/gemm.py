"""Kernels: gemm (being written)."""
