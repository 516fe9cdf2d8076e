"""Shared host-side machinery for every recipe: device, dtype, overlap and config
validation, the interpreter check, the per-device scratch workspace and configuration
dispatch.

Validation reads shapes, dtypes, devices and strides only (never tensor values), so a
call never synchronises with the device and stays CUDA-graph capturable.
"""
from __future__ import annotations

import contextlib
import math
import operator
import os
import re
import threading
from typing import Iterable

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._configs import resolve as _resolve

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
INT64_MIN = -(2**63)
# the integer dtype of each element size: bits moved or compared as integers
SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def interpreter_active() -> bool:
    """True when `triton.jit` decorated our kernels in interpreter mode."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_INTERPRET_AT_IMPORT = interpreter_active()


def interpreter_numpy_problem() -> str | None:
    """Why the Triton interpreter cannot run here, or None. Triton 3.6's interpreter turns
    1-element arrays into ints with int(), which NumPy 2.4 made an error."""
    import numpy

    major, minor = (int(p) for p in numpy.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        return (f"the Triton interpreter (triton 3.6) needs NumPy < 2.4, found "
                f"{numpy.__version__}; install 'numpy<2.4' to run kernels on the CPU")
    return None


_INTERPRETER_PROBLEM = interpreter_numpy_problem() if _INTERPRET_AT_IMPORT else None


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def dtype_size(name: str) -> int:
    """Bytes an element of the dtype a tuning key names ("bfloat16": 2)."""
    return getattr(torch, name).itemsize


def check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the device of the first "
                         f"tensor argument), got one on {t.device}")


def check_runnable(name: str, t: torch.Tensor) -> None:
    """CPU tensors run only under the Triton interpreter; say so clearly otherwise."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu":
        if _INTERPRET_AT_IMPORT:
            if _INTERPRETER_PROBLEM:
                raise RuntimeError(f"{name}: got a CPU tensor, but {_INTERPRETER_PROBLEM}")
            return
        raise RuntimeError(
            f"{name}: got a CPU tensor, but the recipes were imported without the Triton "
            "interpreter; set TRITON_INTERPRET=1 before importing recipes to run the kernels "
            "on the CPU, or pass CUDA tensors")
    raise ValueError(f"{name}: expected a CUDA tensor (or a CPU tensor under the Triton "
                     f"interpreter), got one on {t.device}")


def check_tensor(name: str, t, *, dtypes: Iterable[torch.dtype] | None = None,
                 ndim: int | Iterable[int] | None = None,
                 device: torch.device | None = None) -> None:
    # (hot path: every call validates; the common case does no conversions)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        if type(dtypes) is not tuple:
            dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            want = "/".join(_dtype_name(d) for d in dtypes)
            raise TypeError(f"{name}: expected dtype {want}, got {_dtype_name(t.dtype)}")
    if ndim is not None:
        d = t.dim()
        bad = (d != ndim) if type(ndim) is int else (d not in tuple(ndim))
        if bad:
            dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
            want = " or ".join(f"{d}-D" for d in dims)
            raise ValueError(f"{name}: expected a {want} tensor, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        check_device(name, t, device)


def check_out(name: str, t, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """An `out=` buffer: exact shape and dtype, same device, contiguous (so no two of its
    elements share memory: `check_written` says so first where they do)."""
    check_tensor(name, t, dtypes=(dtype,), device=device)
    if t.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        check_written(name, t)
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")


def check_written(name: str, t: torch.Tensor) -> None:
    """A tensor the call writes (an out= buffer, an in-place argument): ValueError when
    two of its elements may share memory, since programs writing one address race (and
    torch's in-place ops refuse such views too). From shape and strides only. Sorted by
    stride, each dim must step past the whole span of the smaller ones: true of every
    view that slicing, transposing or selecting makes of a dense tensor, false of an
    expanded (stride-0) view and of `as_strided` views whose dims interleave (refused
    even where their elements happen to be distinct: the test stays a cheap one)."""
    if t.is_contiguous() or t.numel() == 0:
        return
    span = 1                                # elements the smaller strides cover
    for stride, size, d in sorted((st, n, d) for d, (n, st)
                                  in enumerate(zip(t.shape, t.stride(), strict=True))
                                  if n > 1):
        if stride < span:
            why = (f"dim {d} has stride 0 (an expanded view)" if stride == 0 else
                   f"dim {d} (stride {stride}) steps inside the span of the dims with "
                   f"smaller strides ({span} elements)")
            raise ValueError(f"{name}: expected a tensor whose dims do not overlap in "
                             f"memory (it is written; by stride, each dim steps past the "
                             f"span of the smaller ones), got shape {tuple(t.shape)} with "
                             f"strides {t.stride()}: {why}")
        span += (size - 1) * stride


# Triton's largest block (elements): a size that one program holds as a block must fit
MAX_BLOCK = tl.TRITON_MAX_TENSOR_NUMEL


def check_int(name: str, v, lo: int | None = None, hi: int | None = None, *,
              none_ok: bool = False, why: str = "") -> int | None:
    """A size argument: an integer (a Python or NumPy int; not a bool, not a tensor,
    whose value would be read from the device) in [lo, hi] (None: unbounded), or None
    where `none_ok`; `why` says where a bound comes from. Returns it as a Python int."""
    if v is None and none_ok:
        return None
    want = "an int or None" if none_ok else "an int"
    if isinstance(v, (bool, torch.Tensor)):
        raise TypeError(f"{name}: expected {want}, got {type(v).__name__}")
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError(f"{name}: expected {want}, got {type(v).__name__}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        want = (f"an int in [{lo}, {hi}]" if lo is not None and hi is not None else
                f"an int >= {lo}" if hi is None else f"an int <= {hi}")
        raise ValueError(f"{name}: expected {want}{f' ({why})' if why else ''}, got {v}")
    return v


def renamed(err: Exception, names: dict) -> Exception:
    """`err` (a TypeError or ValueError of the shared validators) in the caller's words:
    each whole name of `names` in its message replaced by the caller's name for it. An
    adapter that has the recipes' validators check its arguments re-raises what they
    raise through this (`raise C.renamed(e, NAMES) from None`), so its errors name the
    engine's arguments. Other exceptions come back unchanged."""
    if type(err) not in (TypeError, ValueError) or not err.args:
        return err
    pattern = re.compile(r"(?<![\w.])(" + "|".join(
        re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?!\w)")
    msg = pattern.sub(lambda m: names[m.group(1)], str(err))
    return type(err)(msg).with_traceback(err.__traceback__)


def byte_extent(t: torch.Tensor) -> tuple[int, int] | None:
    """[lo, hi): the device addresses t's elements span, from its metadata only (None when
    t is empty). `t.data_ptr()` is `t.untyped_storage().data_ptr()` plus
    `storage_offset() * element_size()`, so these are byte ranges inside t's allocation,
    comparable across the tensors of one device: two ranges intersect only where the
    tensors share an allocation. Views that interleave inside one range (two columns of
    a matrix) count as intersecting: the check is conservative and reads no values."""
    if t.numel() == 0:
        return None
    lo = t.data_ptr()
    es = t.element_size()
    hi = lo + es
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride > 0:
            hi += (size - 1) * stride * es
        else:
            lo += (size - 1) * stride * es
    return lo, hi


def _add_spans(named, written: bool, spans: list) -> list:
    for name, t in named:
        if t is not None:
            n = t.nbytes
            if n:
                if t.is_contiguous():           # the usual case: no walk over the dims
                    lo = t.data_ptr()
                    spans.append((lo, lo + n, written, name))
                else:
                    spans.append((*byte_extent(t), written, name))
    return spans


def check_no_overlap(writes, reads=()) -> None:
    """ValueError when a written tensor shares bytes with another written one or with a
    read one (reads may share memory among themselves). `writes`/`reads`: sequences of
    (argument name, tensor or None), all on one device (checked before this). Host-side,
    from addresses, sizes and strides only (`byte_extent`): no sync, no value read. One
    sort and one sweep over the ranges; next to nothing when no write is given (the
    usual call without out=)."""
    spans = _add_spans(writes, True, [])
    if not spans:
        return
    _add_spans(reads, False, spans)
    if len(spans) < 2:
        return
    spans.sort()
    end_any = end_w = 0                  # the farthest end so far: of any range, of a write
    who_any = who_w = ""
    for lo, hi, written, name in spans:
        if lo < end_w:                   # inside an earlier write
            _overlap(who_w, name)
        if written:
            if lo < end_any:             # a write inside an earlier range
                _overlap(name, who_any)
            if hi > end_w:
                end_w, who_w = hi, name
        if hi > end_any:
            end_any, who_any = hi, name


def _overlap(written: str, other: str) -> None:
    raise ValueError(f"{written}: expected a tensor that shares no memory with {other} "
                     f"(it is written in place), got one whose bytes overlap {other}'s")


def check_logits_rows(name: str, x: torch.Tensor) -> None:
    """Last dim contiguous, V >= 1; rows may be strided (any row stride >= V)."""
    V = x.shape[-1]
    if V < 1:
        raise ValueError(f"{name}: expected a vocabulary (last dim) of at least 1, got {V}")
    if x.stride(-1) != 1 and V > 1:
        raise ValueError(f"{name}: expected the last dim to be contiguous (stride 1), "
                         f"got strides {x.stride()}")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def nearest_pow2(x: float) -> int:
    """The power of two nearest to x in log scale, at least 1."""
    return 1 << max(0, round(math.log2(max(1.0, x))))


_SM_COUNT: dict = {}


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; a nominal 8 under the interpreter."""
    if device.type != "cuda":
        return 8
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNT.get(idx)
    if n is None:
        n = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


PDL_ENV = "SPEC_COOKBOOK_PDL"
_PDL_ON, _PDL_OFF = ("1", "on", "true"), ("0", "off", "false", "")
_PDL: dict = {}


PDL_EARLY, PDL_LATE = 1, 2   # a kernel's PDL constexpr: when it lets the next launch in


def pdl_enabled() -> bool:
    """Whether launches may use PDL: only when SPEC_COOKBOOK_PDL=1 (`pdl_on`). Off by
    default: an engine calls these recipes right after a GEMM or a torch op, which is
    not a PDL launch, and behind such a kernel a PDL launch is slower, not faster
    (docs/performance.md, "Programmatic dependent launch")."""
    v = os.environ.get(PDL_ENV)
    if v is None or v.strip().lower() in _PDL_OFF:
        return False
    if v.strip().lower() in _PDL_ON:
        return True
    raise ValueError(f"{PDL_ENV}: expected 1 (launch with PDL) or 0 (without), got {v!r}")


def pdl(device: torch.device, programs: int | None = None) -> int:
    """How a launch of `programs` programs on `device` uses programmatic dependent launch
    (PDL): 0 not at all (the default, see `pdl_enabled`; CUDA devices before compute
    capability 9.0; the interpreter); else `PDL_EARLY` for grids of at most one program
    a multiprocessor (the kernel lets the next PDL launch begin as soon as it starts)
    and `PDL_LATE` for larger ones (only once each program is past its main loop,
    `pdl_release`, so that the next kernel's programs do not sit beside the scan).
    `programs=None` is for kernels with no main loop to release after (copy_inputs,
    relay, verify_metadata: their programs move a few tiles each): `PDL_EARLY` whatever
    the grid. The value is the kernel's PDL constexpr; the launch takes
    `launch_pdl=value > 0`. The measurements behind these rules are in
    docs/performance.md, section "Programmatic dependent launch".

    A PDL launch may start while the kernel before it on the stream is still running
    (in a CUDA graph too: capture keeps it as a programmatic edge). Every kernel that
    launches this way begins with `pdl_enter`, so it reads and writes nothing before
    that kernel has finished and its writes are visible: what PDL saves is the launch
    latency, not any ordering."""
    if device.type != "cuda" or _INTERPRET_AT_IMPORT or not pdl_enabled():
        return 0
    idx = device.index if device.index is not None else torch.cuda.current_device()
    ok = _PDL.get(idx)
    if ok is None:
        ok = _PDL[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    if not ok:
        return 0
    return PDL_EARLY if programs is None or programs <= sm_count(device) else PDL_LATE


@contextlib.contextmanager
def _pdl_setting(value: str):
    old = os.environ.get(PDL_ENV)
    os.environ[PDL_ENV] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PDL_ENV, None)
        else:
            os.environ[PDL_ENV] = old


def pdl_on():
    """Launches inside the block (and graphs captured there) with PDL on sm_90+: worth it
    where recipes run back to back, each behind another PDL launch."""
    return _pdl_setting("1")


def pdl_off():
    """Launches inside the block (and graphs captured there) without PDL."""
    return _pdl_setting("0")


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a kernel launched with `launch_pdl=PDL > 0`: wait until the
    previous kernel on the stream has completed and its memory is visible
    (griddepcontrol.wait: a no-op when nothing runs before); with `PDL_EARLY`, then let
    the next PDL launch begin (its programs wait in their own `pdl_enter`)."""
    if PDL:
        gdc_wait()
        if PDL == 1:
            gdc_launch_dependents()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """With `PDL_LATE`: let the next PDL launch begin. Called once a program is past its
    main loop; a program that never calls it releases at its exit. Either way the next
    kernel's `pdl_enter` waits for this whole grid, so where it stands only decides
    when the next launch may start, never what it sees."""
    if PDL == 2:
        gdc_launch_dependents()


class _Workspace:
    """Per-device scratch for cross-program reductions.

    `acc` holds packed int64 (key, index) maxima, one per row, resting at INT64_MIN;
    `cnt` holds int32 arrival counters, resting at 0. Kernels that use them put them back
    to rest before they finish (the last program of a group resets its slots), so one
    buffer serves every launch on a stream. It grows (an allocation) only when a call
    needs more slots than any earlier call on that device: warm up at the largest batch
    before capturing a CUDA graph (growing inside a capture raises, since the buffer
    would live in that graph's memory pool). The buffers it outgrows are kept, not
    freed: a graph captured on them goes on replaying into memory that stays at rest
    (they add up to less than the present ones). On CUDA it is allocated by another
    thread (`_apart`), so that it never lands in a pool that the caller's allocations
    are routed to (torch.compile's "reduce-overhead" warm-up routes its thread's
    allocations to its CUDA-graph pool, and then finds a live tensor there that is not
    an output). Launches that share it must not run concurrently on different streams.
    """

    def __init__(self, what: str = "the split-reduction scratch",
                 acc_rest: int = INT64_MIN) -> None:
        self._bufs: dict = {}     # (type, index) -> (acc, cnt, acc slots, cnt slots)
        self._outgrown: list = []  # earlier buffers, which captured graphs may still use
        self._what = what
        self._rest = acc_rest     # the value `acc` rests at

    def get(self, device: torch.device, rows: int, groups: int):
        key = (device.type, device.index)
        got = self._bufs.get(key)
        if got is not None and rows <= got[2] and groups <= got[3]:
            return got[0], got[1]               # the common case: big enough already
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            have = f"{got[2]} row slots and {got[3]} counters" if got else "nothing"
            raise RuntimeError(
                f"workspace: {self._what} on {device} holds {have}; this "
                f"call needs {rows} row slots and {groups} counters, and it cannot grow "
                "inside a CUDA graph capture: call the recipe once outside the graph at "
                "the largest batch first (a warm-up)")
        acc, cnt = (None, None) if got is None else got[:2]
        grow_acc = acc is None or acc.numel() < rows
        grow_cnt = cnt is None or cnt.numel() < groups
        if grow_acc:
            acc = _apart(device, lambda: torch.full(
                (max(1024, next_pow2(rows)),), self._rest, dtype=torch.int64, device=device))
        if grow_cnt:
            cnt = _apart(device, lambda: torch.zeros(
                (max(1024, next_pow2(groups)),), dtype=torch.int32, device=device))
        if got is not None:
            self._outgrown += [old for old, grew in ((got[0], grow_acc), (got[1], grow_cnt))
                               if grew]
        self._bufs[key] = (acc, cnt, acc.numel(), cnt.numel())
        return acc, cnt


def _apart(device: torch.device, make):
    """make() (an allocation and its fill). On CUDA: run by another thread on a fresh
    stream ordered after the current one, the current one then ordered after it (no host
    sync): CUDA-graph pools route the allocations of a thread (torch.compile's
    warm-up, a capture), and this memory must outlive any graph. Elsewhere: here."""
    if device.type != "cuda":
        return make()
    cur = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(cur)
    got: dict = {}

    def work():
        try:
            with torch.cuda.stream(side):
                got["out"] = make()
        except BaseException as e:          # re-raised on the caller's thread
            got["err"] = e

    t = threading.Thread(target=work, name="spec-cookbook-workspace")
    t.start()
    t.join()
    if "err" in got:
        raise got["err"]
    cur.wait_stream(side)
    return got["out"]


WORKSPACE = _Workspace()
# recipes.tp's packed keys between a rank's scan, the all-reduce and the finish (`acc`
# only): rows with no resting value, since every call writes the rows it then reads.
KEYS = _Workspace("the vocabulary-parallel key buffer")
# chain_verify's threshold search (`_threshold_core`): row state words resting at 0
SEARCH = _Workspace("the controls' threshold search state", acc_rest=0)


def pick_config(tuning, key: dict, device: torch.device) -> dict:
    """The tuned config of the nearest key for this GPU, else the heuristic's (a fresh
    dict). Resolved once per (tuning, device, key): later calls with the same key cost a
    dict lookup (`recipes._configs.resolve`; `_configs.clear_cache()` forgets)."""
    return dict(_resolve(tuning, key, device))


def resolve_config(tuning, config, key: dict, device: torch.device,
                   tables: bool = True) -> dict:
    """The config a call runs: `config=None` -> the tuned table / heuristic
    (`pick_config`), or the heuristic alone with `tables=False` (a kernel the recipe's
    table was not measured on); an explicit dict -> checked against the space's keys
    and laid over the heuristic's config (so a partial dict is enough). `tuning`: the
    recipe's `TUNING` (`recipes/_tuning.py`)."""
    if config is None:
        return pick_config(tuning, key, device) if tables \
            else tuning.heuristic(key, device)
    check_config(tuning.name, config, tuning.space)
    return {**tuning.heuristic(key, device), **config}


def check_config(recipe: str, config: dict, space: dict) -> None:
    """An explicit `config=`: a dict whose keys are among the space's and whose values are
    among each key's choices (of the choice's own type: 1024.0 and True are not 1024 and
    1). A recipe's static `constraint` is not applied here: it only prunes the tuner's
    search (configs it rejects give the same bits, just slower), see each recipe."""
    if not isinstance(config, dict):
        raise TypeError(f"config: expected a dict with keys among {sorted(space)}, "
                        f"got {type(config).__name__}")
    for k, v in config.items():
        choices = space.get(k)
        if choices is None:
            unknown = sorted(str(u) for u in config if u not in space)
            raise ValueError(f"config: unknown keys {unknown} for {recipe}; "
                             f"expected keys among {sorted(space)}")
        if not any(type(v) is type(c) and v == c for c in choices):
            raise ValueError(f"config[{k!r}]: expected one of {tuple(choices)} (the "
                             f"{recipe} search space), got {v!r}")
