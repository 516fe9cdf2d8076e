"""What a tune works on: the recipes, their keys (the default key set of the preset, with
the command line's overrides), each key's grid (the configs the static constraint
admits), its heuristic's config, its study and the order its configs are measured in."""
from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass, field

import torch

from recipes._tuning import key_str

from .. import registry
from ..declare import Tunable
from .options import Options
from .search import config_id, order_configs, space_config

# key-field aliases of the CLI options (recipes name their key fields themselves)
FIELD_ALIASES = {"vocab": ("V",), "batch": ("B", "R"), "rows": ("R",), "K": ("K",),
                 "dtype": ("dtype",)}


@dataclass
class Job:
    """One key of one recipe."""
    tunable: Tunable
    key: dict
    grid: list                      # configs the static constraint admits
    study: str                      # its study's name in the store
    heuristic: dict | None = None   # the heuristic's config (space parameters only; its
                                    #   values are choices of the space, but the
                                    #   constraint may reject it: `admitted`)
    order: list = field(default_factory=list)   # the grid, in measurement order
    limit: int = 0                  # configs the budget plans for it (a prefix of order)
    previous: dict | None = None    # the config the table being rewritten holds for it

    @property
    def label(self) -> str:
        return f"{self.tunable.name}[{key_str(self.key)}]"

    @property
    def kstr(self) -> str:
        return key_str(self.key)

    @property
    def admitted(self) -> bool:
        """Whether the heuristic's config is in the grid (the constraint admits it)."""
        return self.heuristic is not None and self.tunable.admits(self.heuristic, self.key)


def select_tunables(opts: Options) -> list[Tunable]:
    registry.load_recipes(opts.package)
    all_t = registry.tunables()
    if opts.recipes:
        missing = [r for r in opts.recipes if r not in all_t]
        if missing:
            raise SystemExit(f"autotune: unknown recipe(s) {missing}; registered: "
                             f"{sorted(all_t)}")
        return [all_t[r] for r in opts.recipes]
    asked = sorted(n for n, t in all_t.items() if t.on_request)
    if asked:
        print(f"autotune: tuned only when named (--recipe): {', '.join(asked)}",
              file=sys.stderr)
    return [all_t[n] for n in sorted(all_t) if not all_t[n].on_request]


def keys_for(t: Tunable, preset: str, overrides: dict) -> list[dict]:
    """The recipe's default keys for `preset`, with CLI overrides applied: every field
    named by an override is replaced by each of its values (a product; duplicates
    dropped). A key without that field is kept as it is."""
    keys = [dict(k) for k in t.default_keys(preset)]
    for opt, values in overrides.items():
        if not values:
            continue
        fields = FIELD_ALIASES.get(opt, (opt,))
        out = []
        for k in keys:
            f = next((f for f in fields if f in k), None)
            if f is None:
                out.append(k)
                continue
            for v in values:
                out.append({**k, f: _coerce(v, k[f])})
        keys = out
    seen, uniq = set(), []
    for k in keys:
        s = key_str(k)
        if s not in seen:
            seen.add(s)
            uniq.append(k)
    return uniq


def _coerce(v, like):
    if isinstance(like, bool):
        return str(v).lower() in ("1", "true", "yes")
    if isinstance(like, int):
        return int(v)
    if isinstance(like, float):
        return float(v)
    return str(v)


def heuristic_config(t: Tunable, key: dict, device: torch.device) -> dict | None:
    """The heuristic's config for `key` (space parameters only), or None when it raises
    or sets a parameter outside the space (said on stderr). A config the constraint
    rejects is kept (what dispatch falls back to all the same) and said so: the search
    cannot measure it, the final re-timing holds it as the baseline, and the key's table
    entry is written only for a config that beats it."""
    try:
        heur = dict(t.heuristic(key, device))
    except Exception as exc:  # noqa: BLE001
        print(f"autotune: {t.name}[{key_str(key)}]: the heuristic raised "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    if any(heur.get(k) not in v for k, v in t.space.items()):
        print(f"autotune: {t.name}[{key_str(key)}]: the heuristic's config {heur} is not "
              "in the search space", file=sys.stderr)
        return None
    if not t.admits(heur, key):
        print(f"autotune: {t.name}[{key_str(key)}]: the heuristic's config {heur} is not "
              "in the grid the constraint admits: a table entry needs a config that beats "
              "it", file=sys.stderr)
    return space_config(heur, t.space)


def job_seed(seed: int, study: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(study.encode())) % (2**31)


def plan(opts: Options, slug: str, device: torch.device,
         tunables: list[Tunable] | None = None, kind: str = "tune") -> list[Job]:
    """One job per key, in rounds over the recipes (`interleave`), each with its grid in
    measurement order (`order_configs`) and, for now, the whole grid planned."""
    from .store import study_name

    jobs = []
    for t in tunables if tunables is not None else select_tunables(opts):
        sh, src = t.space_hash(), t.study_hash()
        for key in keys_for(t, opts.preset, opts.overrides):
            grid = t.configs(key)
            if not grid:
                print(f"autotune: {t.name}[{key_str(key)}]: the constraint admits no "
                      "config of the space; skipped", file=sys.stderr)
                continue
            name = study_name(slug, t.name, key, sh, src, kind)
            j = Job(t, key, grid, name, heuristic_config(t, key, device))
            reorder(j, opts.seed)
            jobs.append(j)
    return interleave(jobs)


def reorder(job: Job, seed: int) -> None:
    """(Re)compute the job's measurement order (after `previous` is known)."""
    job.order = order_configs(job.grid, job.tunable.space, job.heuristic,
                              seed=job_seed(seed, job.study),
                              first=(job.heuristic, job.previous))
    job.limit = job.limit or len(job.order)


def interleave(jobs: list[Job]) -> list[Job]:
    """Jobs in rounds over the recipes (each recipe's first key, then each one's second,
    ...), keys in their recipe's order: a run that falls behind its plan takes the
    shortfall from every recipe's last keys alike."""
    by: dict = {}
    for j in jobs:
        by.setdefault(j.tunable.name, []).append(j)
    out, i = [], 0
    while len(out) < len(jobs):
        out += [js[i] for js in by.values() if i < len(js)]
        i += 1
    return out


def position(job: Job) -> dict:
    """config_id -> index in the job's order."""
    return {config_id(c): i for i, c in enumerate(job.order)}
