"""tools/controls_probe.py compiles each binary of its sweep once before timing."""


def test_warm_jobs_one_per_binary_covering_every_case():
    from tools import controls_probe as P

    jobs = P.warm_jobs((1, 8))
    binaries = [(B, tuple(sorted(P.CASES[n]))) for B, n in jobs]
    assert len(binaries) == len(set(binaries))           # none warmed twice
    for B in (1, 8):                                      # every case's binary warmed
        for c in P.CASES.values():
            assert (B, tuple(sorted(c))) in binaries
    # top_k 20 and top_k 50 (each with top_p) are one binary: fewer jobs than cases
    assert len(jobs) == 2 * (len(P.CASES) - 1)
