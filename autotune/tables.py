"""Tuned tables: `results/<gpu-slug>/<recipe>.json`, what `autotune tune` writes and what
recipes dispatch from (`recipes._configs`, the one reader).

Format (JSON, one object; `format` names the version):

    {
      "format": "spec-cookbook/tuned-table/1",
      "recipe": "argmax",
      "header": {
        "gpu": "NVIDIA H200",           # torch.cuda.get_device_name, or "cpu (Triton interpreter)"
        "slug": "h200",                 # the results/ folder
        "sm_count": 132, "capability": "9.0", "l2_bytes": 52428800,
        "interpreter": false,           # true: a smoke run under the Triton interpreter,
                                        #   never used for dispatch on a GPU
        "label": "...",                 # one line saying what the numbers are
        "timing": "cuda-graph replay median ..." | "wall clock under the Triton interpreter ...",
        "torch": "2.11.0", "triton": "3.6.0", "optuna": "4.5.0", "cuda": "12.8",
        "python": "3.12.3",
        "source_hash": "<16 hex>",      # Tunable.source_hash(): the kernels' source and callees
        "harness_hash": "<16 hex>",     # Tunable.harness_hash(): the suite that made the inputs
        "space_hash": "<16 hex>",       # Tunable.space_hash(): the search space
        "space": {"BLOCK_V": [512, ...], ...},
        "date": "2025-01-01T12:00:00+00:00"   # UTC, when this file was written
      },
      "entries": [                      # one per tuned key, sorted by key
        {
          "key": {"dtype": "bfloat16", "V": 151936, "R": 4},
          "config": {"BLOCK_V": 4096, "SPLIT": 32, "num_warps": 8, "num_stages": 1},
          "admitted": true,             # the static constraint admits `config` (always)
          "p20_us": 5.1, "p50_us": 5.3, "p80_us": 5.6,   # `config`, re-timed at the end
          "heuristic_config": {...},  "heuristic_p50_us": 6.0,   # same key, same re-timing
          "best_config": {...}, "best_p50_us": 5.3,  # the search's fastest, re-timed
          "noise": 0.006,               # the run's spread a win had to beat (or null)
          "chosen_from": "search" | "heuristic" | "previous table",
                                        # `config` is the heuristic's unless the best
                                        #   beat it in every round by more than `noise`
          "torch_p50_us": 9.8,  "torch_timing": "graph" | "eager" | "wall" | null,
          "speedup_vs_heuristic": 1.13, "speedup_vs_torch": 1.85,
          "mode": "exhaustive" | "sampled", "grid": 408,   # configs the constraint admits
          "target": 204, "budget_cut": true,   # configs the budget planned; fewer than
                                               #   the grid were measured
          "trials": {"evaluated": 204, "wrong": 0, "errors": 2},
                                        # evaluated: distinct configs measured; errors:
                                        # failed to compile / out of resources
          "wrong_configs": [{...}],    # configs whose outputs differed from `reference`
          "previous_config": {...}, "previous_p50_us": 5.4,   # the table it replaced
          "no_slower_at": [{"dtype": "bfloat16", "V": 151936, "R": 8}, ...],
                                        # other tuned keys of this table where `config`
                                        #   was measured correct and no slower than that
                                        #   key's heuristic (within 1%)
          "study": "<Optuna study name in the store>"
        }
      ]
    }

Microseconds are per call. `config` always holds every parameter of the recipe's space
(plus any extra field the heuristic returns), so a launcher can use it as it is.

Dispatch (recipes/_configs.py) needs only `entries[*].key` / `entries[*].config` /
`entries[*].no_slower_at` and `header.space_hash` / `header.source_hash` /
`header.interpreter`: a table whose space or source hash differs from the recipe's is
ignored with one warning, and so is any entry whose config the current space does not
admit. `no_slower_at` lists the other tuned keys where the entry's config was measured
no slower than the heuristic; dispatch lends a config to an untuned key only when it
held up at every tuned key near it. Everything else is for people (`autotune show`,
`autotune report`).

Writes are atomic: the JSON goes to a temporary file in the same folder, is flushed and
fsynced, then `os.replace`d over the table, so a reader (or a killed tune) never sees a
half-written table.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import tempfile
from pathlib import Path

import torch

FORMAT = "spec-cookbook/tuned-table/1"

GPU_TIMING = ("cuda-graph replay median per call, after a GPU warm-up, inputs rotated "
              "when they fit in L2; the heuristic's and the best configs re-timed "
              "together in 3 rounds at the end")
INTERPRETER_TIMING = ("wall clock under the Triton interpreter (smoke test of the tuner; "
                      "not a GPU measurement)")
INTERPRETER_LABEL = ("INTERPRETER SMOKE TUNE: checks the tuning pipeline end to end on a "
                     "CPU; the times measure the Triton interpreter, and this table is "
                     "never used for dispatch on a GPU")


def table_path(root: Path, slug: str, recipe: str) -> Path:
    return Path(root) / slug / f"{recipe}.json"


def versions() -> dict:
    """The versions of what a table or report was made with."""
    out = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        out["triton"] = None
    try:
        import optuna
        out["optuna"] = optuna.__version__
    except Exception:  # noqa: BLE001
        out["optuna"] = None
    out["cuda"] = torch.version.cuda
    return out


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"gpu": torch.cuda.get_device_name(device),
                "sm_count": int(p.multi_processor_count),
                "capability": f"{p.major}.{p.minor}",
                "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0),
                "interpreter": False}
    return {"gpu": "cpu (Triton interpreter)", "sm_count": None, "capability": None,
            "l2_bytes": None, "interpreter": True}


def build_header(tunable, device: torch.device, slug: str) -> dict:
    info = device_info(device)
    hdr = {**info, "slug": slug}
    if info["interpreter"]:
        hdr["label"] = INTERPRETER_LABEL
        hdr["timing"] = INTERPRETER_TIMING
    else:
        hdr["label"] = f"tuned on {info['gpu']}"
        hdr["timing"] = GPU_TIMING
    hdr.update(versions())
    hdr["source_hash"] = tunable.source_hash()
    hdr["harness_hash"] = tunable.harness_hash()
    hdr["space_hash"] = tunable.space_hash()
    hdr["space"] = {k: list(v) for k, v in tunable.space.items()}
    hdr["date"] = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    return hdr


def write_json_atomic(path: Path, data) -> None:
    """Write `data` as JSON to `path` atomically (`write_text_atomic`)."""
    write_text_atomic(path, dumps(data) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never a
    torn one: a temporary file in the same folder, fsync, rename, fsync of the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())        # mkstemp makes 0600; a table is for all
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:   # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def dumps(data) -> str:
    """Indented JSON with lists of scalars kept on one line."""
    text = json.dumps(data, indent=1, sort_keys=False, default=_json_default)
    return re.sub(r"\[\s*([^\[\]{}]*?)\s*\]",
                  lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text)


def _json_default(o):
    if isinstance(o, torch.dtype):
        return str(o).replace("torch.", "")
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_table(path: Path) -> dict:
    """Parse and check a table; raises ValueError (or OSError) on anything malformed."""
    from recipes._configs import load_table

    data = load_table(Path(path))
    if not isinstance(data.get("header", {}), dict):
        raise ValueError("'header' is not an object")
    return data


def merge_entries(old: dict | None, header: dict, new_entries: list[dict]) -> tuple[list, int]:
    """Entries for a rewritten table: the new ones, plus old entries for other keys when
    the old table was made by the same kernels and suite over the same space on the same
    kind of device (else they are stale and dropped). Returns (entries, old entries
    dropped)."""
    from recipes._tuning import key_str

    new_keys = {key_str(e["key"]) for e in new_entries}
    kept, dropped = [], 0
    if old:
        oh = old.get("header") or {}
        same = all(oh.get(f) == header.get(f)
                   for f in ("source_hash", "harness_hash", "space_hash", "interpreter",
                             "slug"))
        for e in old.get("entries", []):
            if key_str(e["key"]) in new_keys:
                continue
            if same:
                kept.append(e)
            else:
                dropped += 1
    entries = kept + list(new_entries)
    entries.sort(key=lambda e: _sort_key(e["key"]))
    return entries, dropped


def previous_configs(path: Path, tunable, device: torch.device, slug: str) -> dict:
    """{key_str: config} of the table already at `path`, when that table was made over
    the same space on the same kind of device (its kernels may differ: the tuner
    re-checks and re-times a config before it can be kept); else {}."""
    from recipes._tuning import key_str

    old = _read_or_none(path)
    oh = (old or {}).get("header") or {}
    if not old or (oh.get("space_hash"), oh.get("slug"), bool(oh.get("interpreter"))) != (
            tunable.space_hash(), slug, device.type != "cuda"):
        return {}
    out = {}
    for e in old.get("entries", []):
        cfg = e.get("config") or {}
        if all(k in cfg for k in tunable.space):
            out[key_str(e.get("key") or {})] = {k: cfg[k] for k in tunable.space}
    return out


def _read_or_none(path: Path) -> dict | None:
    """The table at `path`, or None when there is none or it cannot be read."""
    if not Path(path).exists():
        return None
    try:
        return read_table(path)
    except Exception:  # noqa: BLE001 - a damaged table has nothing to offer
        return None


def _sort_key(key: dict):
    return tuple((k, (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                  else (1, 0, str(v))) for k, v in sorted(key.items()))


def update_table(path: Path, tunable, device: torch.device, slug: str,
                 new_entries: list[dict]) -> dict:
    """Merge `new_entries` into the table at `path` (see merge_entries) and write it
    atomically with a fresh header. Returns the written object."""
    old = _read_or_none(path)               # a damaged old table is simply replaced
    header = build_header(tunable, device, slug)
    entries, _ = merge_entries(old, header, new_entries)
    data = {"format": FORMAT, "recipe": tunable.name, "header": header, "entries": entries}
    write_json_atomic(path, data)
    return data
