"""The developers' probes and GPU-pass scripts, outside the package (the wheel ships
`recipes` and `autotune` only). Each runs from the repository root as a script,
`python tools/NAME.py` (it puts the checkout first on sys.path), and imports as
`tools.NAME` (the tests of the stage pricings)."""
