"""examples/spec_decode.py: the speculative decoding loop over transformers models.

Greedy output equals the target's own `generate` token for token (float32), sampled output
reproduces, does not depend on the batch, follows the target's distribution, and a draft
equal to the target accepts every draft. The recipes run under the Triton interpreter on
CPU (tiny models; CUDA runs the side stream and the tail graph too)."""
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, ON_GPU

pytest.importorskip("transformers", reason="the examples extra: pip install -e .[examples]")

ROOT = Path(__file__).resolve().parent.parent


def _load_example():
    spec = importlib.util.spec_from_file_location("spec_decode",
                                                  ROOT / "examples" / "spec_decode.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["spec_decode"] = mod
    spec.loader.exec_module(mod)
    return mod


sd = _load_example()
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
def greedy_want(models, prompts):
    return sd.target_generate(models[0], prompts, N)


@pytest.mark.parametrize("K", [1, 3, 5])
def test_greedy_equals_generate(models, prompts, greedy_want, K):
    target, draft = models
    # alone (a different prompt for each K) and all four in one batch
    for rec in sd.check_greedy(target, draft, prompts, N, [K], [[K % 4], [0, 1, 2, 3]]):
        gen = rec["gen"]
        assert not rec["diverged"], f"K={K} B={rec['B']}: {sd.say_divergence(rec)}"
        flat = [m for step in gen.accepted for m in step]
        assert 0 < sum(flat) < K * len(flat), "acceptance is all or nothing: a weak test"
        if rec["B"] == 4:   # rows of one step accepted different lengths
            assert any(len(set(step)) > 1 for step in gen.accepted)


def test_sampled_reproducible_batch_independent(models, prompts, greedy_want):
    target, draft = models
    a, b, alone = sd.check_sampled(target, draft, prompts, N, K=3)
    assert a.tokens == b.tokens, "run to run"
    assert alone.tokens[0] == a.tokens[0], "alone at another slot with K=1 vs in the batch"
    assert a.tokens[2] == greedy_want[2], "the greedy request (T=0) of a sampled batch"
    assert a.tokens[0] != greedy_want[0] and a.tokens[1] != greedy_want[1], "not sampling?"
    t = sd.check_sampled(target, draft, prompts, N, K=3, ops="torch")[0]
    assert (t.tokens, t.accepted) == (a.tokens, a.accepted), "the plain torch loop"


def test_self_draft_accepts_every_draft(models, prompts, greedy_want):
    target, _ = models
    g, s = sd.check_self_draft(target, prompts[:2], N, K=3)
    assert sd.all_accepted(g, 3) and sd.all_accepted(s, 3), (g.accepted, s.accepted)
    assert g.tokens == greedy_want[:2]


def _chi2(observed, p, n):
    """Pearson's statistic with the cells of expected count < 5 pooled, its degrees of
    freedom, and the 0.1% critical value (Wilson-Hilferty)."""
    e, o = (p * n).flatten(), observed.flatten()
    small = e < 5
    e = torch.cat([e[~small], e[small].sum()[None]])
    o = torch.cat([o[~small], o[small].sum()[None]])
    k = e.numel() - 1
    crit = k * (1 - 2 / (9 * k) + 3.09 * math.sqrt(2 / (9 * k))) ** 3
    return ((o - e) ** 2 / e).sum().item(), k, crit


@torch.no_grad()
def test_sampled_follows_target_distribution():
    """The first two emitted tokens of 4000 requests (seeds 0..3999, one prompt) against
    p(t1) p(t2 | t1) of the target at T = 0.8; t1 comes out of the first verify and t2
    out of it (an accepted draft) or the next (a bonus). The same counts against the
    draft's own distribution must fail: the test tells a sampler that emits drafts.
    CPU: the plain torch loop (the recipes' Philox stream in torch; the test above shows
    it emits the recipes loop's tokens); CUDA: the recipes."""
    V, T, S, prompt = 16, 0.8, 4000, [3, 7, 1]
    dev = torch.device(DEVICE)
    target = sd.make_target(sd.llama_config(V, 32, 2, 2, 1, 64, init=0.2), device=dev, seed=3)
    draft = sd.draft_from(target, 1)

    def joint(model):
        p1 = torch.softmax(model(torch.tensor([prompt], device=dev)).logits[0, -1] / T, -1)
        nxt = torch.tensor([prompt + [t] for t in range(V)], device=dev)
        return (p1[:, None] * torch.softmax(model(nxt).logits[:, -1] / T, -1)).cpu()

    gen = sd.SpecDecoder(target, draft, 3, ops="recipes" if ON_GPU else "torch").generate(
        [prompt] * S, 2, temperature=[T] * S, seeds=list(range(S)))
    assert 0.5 < gen.mean_accepted() < 2.5      # of 3: both accept paths are exercised
    counts = torch.zeros(V, V)
    for t1, t2 in (t[:2] for t in gen.tokens):
        counts[t1, t2] += 1
    stat, k, crit = _chi2(counts, joint(target), S)
    assert stat < crit, f"chi2 {stat:.1f} > {crit:.1f} ({k} dof) against the target"
    stat_d, k_d, crit_d = _chi2(counts, joint(draft), S)
    assert stat_d > crit_d, f"chi2 {stat_d:.1f} against the draft: the test has no power"


def test_rejects_bad_arguments(models):
    target, draft = models
    with pytest.raises(ValueError, match="K"):
        sd.SpecDecoder(target, draft, 0)
    with pytest.raises(ValueError, match="prompts"):
        sd.SpecDecoder(target, draft, 2).generate([[1, 2], [3]], 4)


def test_cli(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sd.main(["--help"])
    assert e.value.code == 0 and "--bench" in capsys.readouterr().out
    out = tmp_path / "spec-decode.md"
    rc = sd.main(["--bench", "--tiny", "--batch", "2", "--K", "2", "--new-tokens", "3",
                  "--repeat", "1", "--out", str(out)])
    text = out.read_text()
    assert rc == 0 and "the same tokens" in text and "transformers" in text
    assert "Made by `python examples/spec_decode.py --bench --tiny --batch 2" in text
    if ON_GPU:   # the side stream's measurement is in the report
        assert "Side stream" in text
