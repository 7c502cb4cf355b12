"""Kernels: reduce (being written)."""
