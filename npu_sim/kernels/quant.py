"""Kernels: quant (being written)."""
