"""Compile ahead: Triton compiles each new config (0.5-2 s) on one thread while the GPU
waits; on a many-core host the tuner compiles the configs it is likely to try in a thread
pool first, through Triton's own `AsyncCompileMode`.

How: the recipe's `run(inputs, config)` is called with every `JITFunction` launch turned
into a compile-only warm-up (`warmup=True`), inside an `AsyncCompileMode` whose executor
is our thread pool; compiles land in Triton's on-disk cache, so the later real launch of
that config finds its binary instead of compiling it. Nothing is launched on the GPU.
It is an accelerator only: any failure disables it with one message, and a config that
was not compiled ahead is compiled at its trial as usual. Pending compiles of an earlier
key are cancelled when the next key is submitted.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor


class Precompiler:
    def __init__(self, threads: int, max_per_job: int = 256):
        import triton

        self.executor = ThreadPoolExecutor(max_workers=threads,
                                           thread_name_prefix="autotune-compile")
        self.mode = triton.AsyncCompileMode(self.executor, ignore_errors=True)
        self.max_per_job = max_per_job
        self.enabled = True

    def _cancel_pending(self) -> None:
        fk = self.mode.future_kernels
        for key in list(fk):
            if fk[key].future.cancel():
                del fk[key]
        self.mode.raw_futures = [f for f in self.mode.raw_futures if not f.cancelled()]

    def submit(self, job, inputs, order: list[dict]) -> None:
        """Queue compiles of the job's configs in `order` (a guess at the trial order: the
        heuristic's first, then the grid in a seeded shuffle; TPE picks its own order
        after its first trials), at most `max_per_job` of them."""
        if not self.enabled:
            return
        try:
            from triton.runtime import _async_compile
            from triton.runtime.jit import JITFunction

            order = list(order)[: self.max_per_job]
            self._cancel_pending()
            orig = JITFunction.run

            def compile_only(fn, *args, grid, warmup, **kwargs):
                return orig(fn, *args, grid=grid, warmup=True, **kwargs)

            token = _async_compile.active_mode.set(self.mode)
            JITFunction.run = compile_only
            try:
                for cfg in order:
                    try:
                        job.tunable.run(inputs, cfg)
                    except Exception:  # noqa: BLE001 - the trial will report it
                        pass
            finally:
                JITFunction.run = orig
                _async_compile.active_mode.reset(token)
        except Exception as exc:  # noqa: BLE001
            self.enabled = False
            print(f"autotune: compile-ahead disabled ({type(exc).__name__}: {exc}); "
                  "configs compile at their trials", file=sys.stderr)

    def close(self) -> None:
        self._cancel_pending()
        self.executor.shutdown(wait=False, cancel_futures=True)
