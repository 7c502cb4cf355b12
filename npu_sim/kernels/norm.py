"""Kernels: norm (being written)."""
