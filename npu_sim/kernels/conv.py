"""Kernels: conv (being written)."""
