"""Benchmark suites, one module a recipe: the shapes the benchmark covers, how to make
each case's inputs, and the variants timed on it ("ours" and torch's ways). Each module
lists its suites in `SUITES` (`autotune.registry.load_suites`)."""


def dtype_name(dt) -> str:
    """torch.bfloat16 -> 'bfloat16', as the keys and labels spell dtypes."""
    return str(dt).replace("torch.", "")
