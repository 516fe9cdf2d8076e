"""spec-cookbook's autotuner: one registry of what to tune and benchmark, Optuna
searches over it, CUDA-graph timing, and the per-GPU tables that recipes dispatch from.

Only `autotune/suites/` knows recipes by name: each of its modules pairs a recipe's
dispatch facts (its `TUNING`) with the harness that runs it (`autotune.declare`), the
registry (`autotune.registry`) collects them, and everything else iterates the registry.
"""
