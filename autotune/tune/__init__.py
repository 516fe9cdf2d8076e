"""The tuner behind `python -m autotune tune`: measure each recipe's configs per key on
this GPU and write `results/<gpu-slug>/<recipe>.json` (what dispatch reads) and
`results/<gpu-slug>/tune-report.json` (what the run did and where its time went).

The pipeline, module by module:
  plan      recipes, keys (the preset's default keys, CLI overrides), each key's grid (the
            configs the static constraint admits), its heuristic's config and its order
  search    the order a key's grid is measured in, and the Optuna study (a grid sampler
            over that order) that records each measured config
  compile   the probe of every planned config's Triton binaries, and a pool of processes
            that compiles each distinct binary once into Triton's on-disk cache
  compile_worker  what each of the pool's processes runs; cubin: a binary's registers
  measure   a key's inputs and references (made once), the bit-for-bit check, the timing
  budget    the coverage: the fraction of every grid the time budget allows
  store     the durable study store a later run resumes from
  write     each key's entry (the heuristic's config unless beaten beyond the noise), the
            no_slower_at lists dispatch lends configs by, the tables and the report
  run       a tune's start (device, options, plan), one key's measurement loop
            (`Session.measure`), the tables and report as keys finish (`Run`), and the
            whole run in one process
  workers   the whole run in one process per GPU (`--workers N`)
  main      `tune`: the start, then the run in this process or in the workers
  phases    the time of each phase, for the report

Importing this package imports nothing else: `device.select_device()` must switch the
Triton interpreter on before anything imports the recipes.
"""


def __getattr__(name):
    if name == "tune":
        from .main import tune
        return tune
    if name == "Options":
        from .options import Options
        return Options
    raise AttributeError(name)
