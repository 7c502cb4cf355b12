"""Kernels: activations (being written)."""
