"""Drop-in adapters: functions with a serving engine's names, arguments and outputs, built
on spec-cookbook's kernels (`recipes.compat.sglang`)."""
