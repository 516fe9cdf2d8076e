"""Small shared test utilities."""
import pytest
import torch

from tests.conftest import ON_GPU  # noqa: F401  (re-exported)

_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bit patterns on the CPU: floating dtypes viewed as same-size integers
    (-0.0 differs from +0.0, a NaN equals the same NaN), as the tuner compares them
    (`autotune.bitwise`; the recipe tests import only `recipes` and these helpers)."""
    t = t.detach().cpu().contiguous()
    return t.view(_SAME_SIZE_INT[t.element_size()]) if t.is_floating_point() else t


class CountingKernel:
    """Stands in for a module's Triton kernel and counts its launches:
    `monkeypatch.setattr(module, name, CountingKernel(getattr(module, name)))`."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]

    def __getattr__(self, name):      # warmup, fn, ...: the kernel's own (not launches)
        return getattr(self.kernel, name)


def bad(case_id, call, exc, match):
    """A row of a bad-input table: `call(device)` raises `exc` whose message matches the
    regex `match` (which names the argument or config key)."""
    return pytest.param(call, exc, match, id=case_id)


def bad_inputs_test(table):
    """The test of a bad-input table (rows from `bad`): each call raises as its row says.
    A module binds it as `test_bad_inputs = bad_inputs_test(BAD)`."""
    @pytest.mark.parametrize("call,exc,match", table)
    def test_bad_inputs(device, call, exc, match):
        with pytest.raises(exc, match=match):
            call(device)
    return test_bad_inputs


def int64_alias(t: torch.Tensor, n: int) -> torch.Tensor:
    """A contiguous int64 [n] over the first 8n bytes of t (contiguous): an out= buffer
    that shares memory with t."""
    return t.reshape(-1).view(torch.int8)[:8 * n].view(torch.int64)


def assert_equal(got, want, what=""):
    """Bitwise equality (floats compared by their bits) with a useful message."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    got_c, want_c = got.cpu(), want.cpu()
    if not torch.equal(bits(got_c), bits(want_c)):
        bad = (bits(got_c) != bits(want_c)).nonzero()[:8].tolist()
        raise AssertionError(f"{what}: mismatch at {bad}: got {got_c.flatten()[:16].tolist()} "
                             f"want {want_c.flatten()[:16].tolist()}")


def sample_configs(configs, n, seed=0):
    """All configs on the GPU; a seeded sample of n (always incl. first/last) on CPU."""
    if ON_GPU or len(configs) <= n:
        return configs
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(configs), generator=g)[: n - 2].tolist()
    return [configs[0]] + [configs[i] for i in sorted(idx)] + [configs[-1]]


def hard_logits(R, V, dtype, device, seed=0):
    """Random rows plus the argmax corner cases (all -inf, all equal, NaN vs +inf, first
    NaN, -0.0 vs +0.0, a tie across blocks, one finite value, +inf last), one per row
    where R allows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, V, generator=g).to(dtype)
    low = -6e4 if dtype == torch.float16 else -1e30
    cases = [
        lambda r: r.fill_(float("-inf")),                          # all -inf -> 0
        lambda r: r.__setitem__(slice(None), 1.0),                 # all equal -> 0
        lambda r: (r.__setitem__(V // 2, float("nan")),            # NaN beats +inf
                   r.__setitem__(0, float("inf"))),
        lambda r: (r.__setitem__(V - 1, float("nan")),             # first NaN wins
                   r.__setitem__(V // 3, float("nan"))),
        lambda r: (r.fill_(-1.0), r.__setitem__(V - 1, 0.0),       # -0.0 ties +0.0
                   r.__setitem__(V // 2, -0.0)),
        lambda r: (r.__setitem__(V - 1, 100.0),                    # tie across blocks
                   r.__setitem__(min(V - 1, 513), 100.0)),
        lambda r: (r.__setitem__(slice(None), float("-inf")),      # one finite value
                   r.__setitem__(V - 1, low)),
        lambda r: r.__setitem__(V - 1, float("inf")),             # +inf at the end
    ]
    for i in range(min(R, len(cases))):
        cases[i](x[i])
    return x.to(device)


def capture(fn):
    """Capture `fn()` in a CUDA graph; returns (graph, bytes the capture allocated beyond
    what capturing an empty graph allocates: <= 0 when `fn` allocates nothing). torch's
    capture machinery takes memory of its own (on the H200 with torch 2.11 an empty
    capture took 1 KiB and a capture of our launches 0), so the baseline is an empty
    capture, taken after a first one that absorbs any once-per-process cost."""
    def captured(body):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        return g, torch.cuda.memory_allocated() - before

    captured(lambda: None)
    _, empty = captured(lambda: None)
    graph, used = captured(fn)
    return graph, used - empty


def drafts_around(t, V, seed, dtype=torch.int64, device=None):
    """Drafts [B, K] for target tokens t [B, K+1] (CPU) that accept a random prefix; the
    first miss cycles through a wrong in-vocab id, -1 padding to the end (a request that
    drafted fewer), V and V + 7 (outside the vocabulary)."""
    B, K = t.shape[0], t.shape[1] - 1
    g = torch.Generator().manual_seed(seed)
    d = t[:, :K].clone()
    for b in range(B):
        if K == 0:
            break
        cut = int(torch.randint(0, K + 1, (1,), generator=g))
        if cut < K:
            kind = b % 4
            d[b, cut] = [(d[b, cut] + 1) % V, -1, V, V + 7][kind]
            if kind == 1:
                d[b, cut:] = -1
    return d.to(dtype).to(device)
