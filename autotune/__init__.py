"""spec-cookbook's autotuner: a registry that recipes fill, Optuna searches over it,
CUDA-graph timing, and the per-GPU tables that recipes dispatch from.

This package names no recipe: recipes register themselves (`autotune.registry`) when
their package is imported, and everything here iterates the registry.
"""
