"""What tuning and benchmarking a recipe need beyond dispatch, one module a recipe: its
tuning inputs, bytes moved, default keys and torch peers, paired with the recipe's
`TUNING` in `TUNABLES` (`autotune.declare.Tunable`), and its benchmark `SUITES` (the
shapes covered, each case's inputs, the variants timed: "ours" and torch's ways).
`autotune.registry` collects both."""


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
