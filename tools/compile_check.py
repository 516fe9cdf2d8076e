"""Compile kernels for a CUDA target without a GPU (Triton's own compiler and the ptxas it
ships), and print each one's registers. It catches what the interpreter accepts and the
compiler refuses (a module constant that is not tl.constexpr, a type that changes inside
an `if`, a failing MLIR pass), before device time is spent on it.

    python tools/compile_check.py [controls|sampled|all] [--arch 90] [--set K=V,..]

Each line also gives the compile's seconds (with a warm Triton cache, its load: point
TRITON_CACHE_DIR at an empty folder to time the compile). `--set` overrides constexprs,
e.g. `--set HAS_K=0,HAS_M=0` for the top_p-only controls binary. Runs with
TRITON_INTERPRET unset (it sets it to 0 for itself)."""
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout first

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TC = importlib.import_module("recipes._threshold_core")
CV = importlib.import_module("recipes.chain_verify")

# pointer element types by argument name (others *i64); scalars are i32
_PTRS = {"logits_ptr": "*bf16", "temp_ptr": "*fp32", "topp_ptr": "*fp32", "minp_ptr": "*fp32",
         "cnt_ptr": "*i32", "rcnt_ptr": "*i32", "accept_ptr": "*i32"}


def _base(num_warps: int) -> dict:
    return dict(BLOCK_V=2048 * num_warps // 4, UNROLL=1, KP1=4, VEC=8, EXACT=0, MAXC=CV.MAXC,
                SGLANG=False)


def kernels():
    """name -> (jit function, constexprs, num_warps)."""
    controls = dict(HAS_K=True, HAS_P=True, HAS_M=True, CAPK=32, SUBN=512, NCN=128, MN=256,
                    PHASES=TC.NPH, PCHECK=True, TBLOCKS=3 + TC.NPH)
    out = {}
    for w in (4, 8):
        out[f"controls-w{w}"] = (CV._controls_verify_kernel,
                                 {**_base(w), **controls, "SEL_BLOCK": 256 * w, "LB": 32 * w},
                                 w)
        out[f"sampled-w{w}"] = (CV._verify_kernel, {**_base(w), "SAMPLED": True, "PDL": 0}, w)
    return out


def compile_one(fn, meta: dict, num_warps: int, arch: int) -> str:
    """Compile; return ptxas's resource line for the kernel."""
    sig = {n: "constexpr" if n in meta else _PTRS.get(n, "*i64") if n.endswith("_ptr")
           else "i32" for n in fn.arg_names}
    sig.update({n: "fp32" for n in fn.arg_names if n == "T"})
    consts = {(fn.arg_names.index(k),): v for k, v in meta.items() if k in fn.arg_names}
    src = ASTSource(fn, sig, constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": num_warps, "num_stages": 1})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        got = subprocess.run([str(tool), "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    return next((ln.strip() for ln in got.splitlines() if "REG:" in ln), "?")


def _option(argv, flag: str, default: str) -> str:
    if flag not in argv:
        return default
    i = argv.index(flag)
    if i + 1 == len(argv):
        raise SystemExit(f"{flag}: expected a value after it, got none")
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def overrides(text: str) -> dict:
    """`K=V,..` -> {K: int(V)} (whether the kernel takes K is checked by `main`)."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not key or not sep or not value.lstrip("-").isdigit():
            raise SystemExit(f"--set: expected KEY=INTEGER items, got {item!r}")
        out[key] = int(value)
    return out


def main(argv) -> int:
    arch = int(_option(argv, "--arch", "90"))
    extra = overrides(_option(argv, "--set", ""))
    which = argv[0] if argv else "all"
    for name, (fn, meta, w) in kernels().items():
        if which == "all" or name.startswith(which):
            unknown = sorted(set(extra) - set(meta))
            if unknown:
                raise SystemExit(f"--set: {name} has no constexpr {unknown[0]!r}; it "
                                 f"takes {sorted(meta)}")
            t0 = time.perf_counter()
            res = compile_one(fn, {**meta, **extra}, w, arch)
            print(f"{name}: {res} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
