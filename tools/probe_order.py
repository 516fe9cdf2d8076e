"""Read-only: does the order in which the GPU walks the B=256 rows set the ceiling? (GPU)

`probe_inflight.py` and `probe_staged.py` (results/h200/probes/) read the B=256
V=151936 bf16 logits (with the hidden copy) in 21.9-22.9 us with every layout that
gives each row to one program or a few (1-8 tiles in flight, cp.async staging, 4-16
warps, SPLIT 1-4), while a kernel of 8 KB programs in address order reads the same bytes
in 19.8 us. Hypothesis: the difference is the access pattern (256 streams 304 KB apart
against one sweep of the address space), not the bytes in flight. Timed here, read-only
(each program sums what it reads), CUDA-graph replay medians in us:

1. 8 KB programs in address order (row-major), and in column-major order (program p
   reads tile p // 256 of row p % 256: the rows' streams side by side);
2. G persistent programs walking items of K tiles in address order with a grid stride
   (item i = g + k * G), the next item's loads issued before the current one is summed;
3. a program a row (the recipe's layout), for reference.
Usage: python tools/probe_order.py OUTFILE
"""
import sys

import torch
import triton
import triton.language as tl
from probe_tail import rec, sayer  # noqa: E402

from recipes import _common as C


@triton.jit
def _tiles(x_ptr, out_ptr, B, T, V, stride, BLOCK: tl.constexpr, COLMAJOR: tl.constexpr):
    p = tl.program_id(0)
    if COLMAJOR:
        r = p % B
        t = p // B
    else:
        r = p // T
        t = p % T
    o = t * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + r.to(tl.int64) * stride + o, mask=o < V, other=0.0)
    tl.store(out_ptr + p, tl.sum(v.to(tl.float32), 0))


@triton.jit
def _stride(x_ptr, out_ptr, n_items, per_row, V, stride, G, BLOCK: tl.constexpr,
            K: tl.constexpr):
    g = tl.program_id(0)
    lanes = tl.arange(0, K * BLOCK)
    acc = tl.zeros([K * BLOCK], tl.float32)
    i = g
    r = i // per_row
    o = (i % per_row) * (K * BLOCK) + lanes
    x = tl.load(x_ptr + r.to(tl.int64) * stride + o, mask=(o < V) & (i < n_items), other=0.0)
    while i < n_items:
        j = i + G
        r = j // per_row
        o = (j % per_row) * (K * BLOCK) + lanes
        y = tl.load(x_ptr + r.to(tl.int64) * stride + o, mask=(o < V) & (j < n_items),
                    other=0.0)
        acc += x.to(tl.float32)
        x = y
        i = j
    tl.store(out_ptr + g, tl.sum(acc, 0))


@triton.jit
def _rows(x_ptr, out_ptr, V, stride, n_tiles, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    row = x_ptr + r.to(tl.int64) * stride
    x = tl.load(row + lanes, mask=lanes < V, other=0.0)
    for t in range(0, n_tiles):
        o = (t + 1) * BLOCK + lanes
        y = tl.load(row + o, mask=o < V, other=0.0)
        acc += x.to(tl.float32)
        x = y
    tl.store(out_ptr + r, tl.sum(acc, 0))


def main(path):
    dev = torch.device("cuda")
    sms = C.sm_count(dev)
    say = sayer(path)
    say(f"# {torch.cuda.get_device_name(dev)} ({sms} SMs); torch {torch.__version__}, "
        f"triton {triton.__version__}; read-only, graph-replay medians in us")
    B, V = 256, 151936
    xs = [torch.randn(B, V, device=dev).to(torch.bfloat16) for _ in range(3)]
    out = torch.empty(B * 256, device=dev)
    nb = B * V * 2
    say(f"## B={B} V={V} bf16 logits only: {nb / 1e6:.2f} MB; at 4.24 TB/s {nb / 4.24e6:.2f} us")

    def t2(fn):
        a, b = rec(fn, xs, twice=True)
        return f"{a:7.2f} {b:7.2f}  ({nb / min(a, b) / 1e6:.2f} TB/s)"

    for bv, w in ((4096, 4), (2048, 4), (8192, 8)):
        T = C.cdiv(V, bv)
        for cm in (0, 1):
            say(f"{bv * 2 // 1024} KB programs, {'column' if cm else 'row'}-major, w{w}: "
                + t2(lambda x, bv=bv, T=T, cm=cm, w=w: _tiles[(B * T,)](
                    x, out, B, T, V, x.stride(0), BLOCK=bv, COLMAJOR=cm, num_warps=w)))
    for bv, k, w in ((4096, 1, 8), (4096, 2, 16), (2048, 2, 8), (2048, 4, 16), (4096, 1, 16)):
        per_row = C.cdiv(V, bv * k)
        n = B * per_row
        for m in (1, 2, 4, 8):
            G = m * sms
            if w * m > 64:
                continue
            say(f"grid stride G={G} items of {k}x{bv} w{w}: "
                + t2(lambda x, bv=bv, k=k, w=w, G=G, per_row=per_row, n=n: _stride[(G,)](
                    x, out, n, per_row, V, x.stride(0), G, BLOCK=bv, K=k, num_warps=w)))
    for bv, w in ((4096, 16), (8192, 16)):
        say(f"a program a row {bv} w{w}: "
            + t2(lambda x, bv=bv, w=w: _rows[(B,)](x, out, V, x.stride(0), C.cdiv(V, bv),
                                                  BLOCK=bv, num_warps=w)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-order.txt")
