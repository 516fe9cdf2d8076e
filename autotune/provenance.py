"""How a report in `results/<gpu>/` was made: the GPU, the versions, the date and the
command, in one format for every report.

A report's JSON carries these as top-level fields (`FIELDS`: "gpu", "torch", "triton",
"cuda", "python", "date", "command"), as `BENCH.json`, the bench's suite files,
`tune-report.json`, `tuner-quality.json` and `targets.json` do; its page opens with
`line(...)` of them. A field a file never recorded (a report from before it carried
one) is rendered as "not recorded", never guessed. Paths in a report are relative to
the results root (`relative`): a machine's own folders are nobody else's business.
"""
from __future__ import annotations

import datetime as _dt
import shlex
from pathlib import Path

FIELDS = ("gpu", "torch", "triton", "cuda", "python", "date", "command")
VERSIONS = (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"), ("python", "Python"))
NOT_RECORDED = "not recorded"


def now() -> str:
    """The date of a report: UTC, to the minute."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def command_line(prog: str, argv) -> str:
    """The command as a user types it: `prog` (e.g. "python -m autotune bench") and the
    arguments, quoted for a POSIX shell, an absolute path among them made relative to
    the working directory (`relative`)."""
    def arg(a: str) -> str:
        opt, eq, val = a.partition("=") if a.startswith("--") else ("", "", a)
        return opt + eq + (relative(val, Path.cwd()) if val.startswith("/") else val)

    return " ".join([prog, *(shlex.quote(arg(str(a))) for a in argv)])


def header(device, command: str | None) -> dict:
    """The header of a report made now on `device` by `command`."""
    from .tables import device_info, versions

    ver = versions()
    return {"gpu": device_info(device)["gpu"], **{k: ver.get(k) for k, _ in VERSIONS},
            "date": now(), "command": command}


def of(doc) -> dict:
    """The header fields a report's JSON records (an older file may keep its versions
    under "versions"); fields it lacks are absent."""
    if not isinstance(doc, dict):
        return {}
    nested = doc.get("versions") if isinstance(doc.get("versions"), dict) else {}
    out = {k: nested[k] for k, _ in VERSIONS if nested.get(k) is not None}
    out.update({k: doc[k] for k in FIELDS if doc.get(k) is not None})
    return out


def versions_text(h: dict) -> str:
    """"torch X, triton Y, CUDA Z, Python W" of what `h` records."""
    known = [f"{name} {h[k]}" for k, name in VERSIONS if h.get(k)]
    return ", ".join(known) if known else f"versions {NOT_RECORDED}"


def line(h: dict) -> str:
    """A report's header as one markdown line: date; GPU; versions; command."""
    cmd = h.get("command")
    return (f"{h.get('date') or 'date ' + NOT_RECORDED}; GPU: {h.get('gpu') or NOT_RECORDED}; "
            f"{versions_text(h)}; command: " + (f"`{cmd}`" if cmd else NOT_RECORDED))


def relative(path, root) -> str:
    """`path` relative to `root` when it lies under it; elsewhere ".../" and its name
    (where it lay on one machine tells no one else anything). A URL (a study store's
    database) is kept as given."""
    text = str(path)
    if "://" in text:
        return text
    p, r = Path(path).resolve(), Path(root).resolve()
    try:
        return p.relative_to(r).as_posix()
    except ValueError:
        return f".../{p.name}"
