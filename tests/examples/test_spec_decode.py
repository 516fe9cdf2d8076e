"""examples/spec_decode.py: the engine-shaped decode loop (paged KV cache, the whole step
one CUDA graph on a GPU, eager on CPU with the recipes under the interpreter).

Greedy output equals the Hugging Face target's own `generate` token for token (float32),
for both loops (recipes, plain torch); sampled output reproduces, does not depend on the
batch, keeps the greedy rows of a mixed batch greedy, and a draft equal to the target
accepts every draft."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import DEVICE, ON_GPU

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
pytest.importorskip("transformers", reason="the examples extra: pip install -e .[examples]")
import spec_decode as sd  # noqa: E402

N = 8                                   # new tokens a request
PROMPT_LENS = (5, 9, 2, 7)              # one of 2 tokens: a row whose draft prefill is empty


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # these models are tiny: one thread is faster, by far on a loaded machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def models():
    return sd.build("tiny", torch.float32, torch.device(DEVICE))


@pytest.fixture(scope="module")
def prompts(models):
    return sd.random_prompts(models[0].config.vocab_size, PROMPT_LENS, seed=0)


@pytest.fixture(scope="module")
def want(models, prompts):
    return sd.target_generate(models[0], prompts, N)


def decoder(models, K, ops="recipes", draft=None, **kw):
    _, target, d = models
    kw = dict(dict(max_requests=8, max_len=9 + N + 2 * K + 2, page_size=4), **kw)
    return sd.SpecDecoder(target, draft or d, K, ops=ops, **kw)


@pytest.mark.parametrize("ops,K", [("recipes", 1), ("recipes", 3), ("torch", 3)])
def test_greedy_equals_generate(models, prompts, want, ops, K):
    dec = decoder(models, K, ops)
    alone = dec.generate(prompts[K % 4:K % 4 + 1], N, slots=[6])
    assert alone.tokens == [want[K % 4]]
    gen = dec.generate(prompts, N, slots=[3, 0, 7, 1])   # the pages interleave
    assert gen.tokens == want, f"ops={ops} K={K}"
    assert 0 < gen.mean_accepted < K, "acceptance is all or nothing: a weak test"


def test_sampled_reproducible_batch_independent(models, prompts, want):
    temps, seeds = [0.7, 1.0, 0.0, 0.7], [11, 12, 13, 14]
    dec = decoder(models, 3)
    a = dec.generate(prompts, N, temperature=temps, seeds=seeds)
    b = dec.generate(prompts, N, temperature=temps, seeds=seeds, slots=[4, 5, 6, 7])
    assert a.tokens == b.tokens, "run to run, at other slots"
    alone = decoder(models, 1).generate(prompts[:1], N, temperature=temps[:1],
                                        seeds=seeds[:1], slots=[2])
    assert alone.tokens[0] == a.tokens[0], "alone with K=1 vs in the batch with K=3"
    assert a.tokens[2] == want[2], "the greedy request (T=0) of a sampled batch"
    assert a.tokens[0] != want[0] and a.tokens[1] != want[1], "not sampling?"
    t = decoder(models, 3, "torch").generate(prompts, N, temperature=temps, seeds=seeds)
    assert t.tokens[2] == want[2], "the torch loop's greedy row"


def test_self_draft_accepts_every_draft(models, prompts, want):
    hf, target, _ = models
    dec = decoder(models, 3, draft=target)
    g = dec.generate(prompts[:2], N)
    assert g.tokens == want[:2] and g.mean_accepted == 3


def test_qwen2_biases_equal_generate():
    hf, target, draft = sd.build("tiny", torch.float32, torch.device(DEVICE), arch="qwen2")
    ps = sd.random_prompts(hf.config.vocab_size, (6, 3), seed=1)
    gen = sd.SpecDecoder(target, draft, 2, max_requests=2, max_len=32, page_size=4) \
        .generate(ps, N)
    assert gen.tokens == sd.target_generate(hf, ps, N)


def test_rejects_bad_arguments(models):
    with pytest.raises(ValueError, match="K"):
        decoder(models, 0)
    dec = decoder(models, 2)
    with pytest.raises(ValueError, match="prompts"):
        dec.generate([[1, 2], [3]], 4)
    with pytest.raises(ValueError, match="max_len"):
        dec.generate([[1, 2]], 100)
    with pytest.raises(ValueError, match="slots"):
        dec.generate([[1, 2], [3, 4]], 4, slots=[1, 1])
    with pytest.raises(ValueError, match="top_k"):
        dec.generate([[1, 2]], 4, top_k=[3])


def test_help_without_transformers():
    """--help imports nothing of transformers (a fresh interpreter where it is hidden)."""
    code = ("import sys; sys.modules['transformers'] = None; sys.argv = ['x', '--help'];"
            "import runpy; runpy.run_path('examples/spec_decode.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "--bench" in r.stdout, r.stderr


def test_bench_smoke(tmp_path):
    out = tmp_path / "spec-decode.md"
    rc = sd.main(["--bench", "--tiny", "--batch", "2", "--K", "2", "--new-tokens", "3",
                  "--runs", "1", "--out", str(out)])
    text = out.read_text()
    assert rc == 0 and "the same tokens" in text and "transformers" in text
    assert "Made by `python examples/spec_decode.py --bench --tiny --batch 2" in text
    assert (tmp_path / "spec-decode.json").exists()
    # the default mix: request 1 samples (T=0.7, top_k=20, top_p=0.95) beside greedy request 0
    assert "greedy and sampled requests in one batch" in text
    assert "the same tokens on the 1 greedy requests" in text
    if ON_GPU:
        assert "GPU busy" in text and "pieces' share" in text
