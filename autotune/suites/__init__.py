"""Benchmark suites, one module a recipe: the shapes the benchmark covers, how to make
each case's inputs, and the variants timed on it ("ours" and torch's ways). Each module
lists its suites in `SUITES` (`autotune.registry.load_suites`)."""


def dtype_name(dt) -> str:
    """torch.bfloat16 -> 'bfloat16', as the keys and labels spell dtypes."""
    return str(dt).replace("torch.", "")


def without_pdl(call):
    """`call` (state -> outputs) with every launch made without programmatic dependent
    launch: the "ours, PDL off" variant, timed like "ours" behind the bench's plain
    kernel, so the two columns say what PDL costs or saves there."""
    import recipes

    def run(s):
        with recipes.pdl_off():
            return call(s)
    return run
