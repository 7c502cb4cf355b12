"""Kernels: resize (being written)."""
