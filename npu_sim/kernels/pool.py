"""Kernels: pool (being written)."""
