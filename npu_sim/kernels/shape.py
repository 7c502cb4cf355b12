"""Kernels: shape (being written)."""
