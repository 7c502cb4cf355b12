"""Kernels: elementwise (being written)."""
