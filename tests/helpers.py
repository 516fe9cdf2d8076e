"""Small shared test utilities."""
import torch

from conftest import ON_GPU  # noqa: F401  (re-exported)


def assert_equal(got, want, what=""):
    """Bitwise equality with a useful message."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    got_c, want_c = got.cpu(), want.cpu()
    if not torch.equal(got_c, want_c):
        bad = (got_c != want_c).nonzero()[:8].tolist()
        raise AssertionError(f"{what}: mismatch at {bad}: got {got_c.flatten()[:16].tolist()} "
                             f"want {want_c.flatten()[:16].tolist()}")


def sample_configs(configs, n, seed=0):
    """All configs on the GPU; a seeded sample of n (always incl. first/last) on CPU."""
    if ON_GPU or len(configs) <= n:
        return configs
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(configs), generator=g)[: n - 2].tolist()
    return [configs[0]] + [configs[i] for i in sorted(idx)] + [configs[-1]]
