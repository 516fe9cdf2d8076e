"""Benchmark suites, one module a recipe: the shapes the benchmark covers, how to make
each case's inputs, and the variants timed on it ("ours" and torch's ways). Each module
lists its suites in `SUITES` (`autotune.registry`; the tuner reads their `TUNABLES` there too)."""


def dtype_name(dt) -> str:
    """torch.bfloat16 -> 'bfloat16', as the keys and labels spell dtypes."""
    return str(dt).replace("torch.", "")


def with_pdl(call, name: str = "ours") -> dict:
    """The variants of `call` (state -> outputs) with every launch made with programmatic
    dependent launch (`recipes.pdl_on`): "<name>, PDL on" behind the bench's plain
    kernel, next to "ours" (PDL off, the default), says what PDL costs there; "<name>,
    PDL on (back to back)" says what it saves where our launches follow each other."""
    import recipes
    from autotune.declare import BenchVariant

    def run(s):
        with recipes.pdl_on():
            return call(s)
    return {f"{name}, PDL on": BenchVariant(run),
            f"{name}, PDL on (back to back)": BenchVariant(run, back_to_back=True)}
