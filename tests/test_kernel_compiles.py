"""voxflow.engine.kernel_compiles: Triton compiles counted at startup and while serving, and a served step that
compiled a kernel says so in its trace line and in /health's engine stats.

The first test compiles a real kernel for a Hopper target (sm_90) on this CPU: Triton's compiler and ptxas need no
GPU, and the compilation listener fires as it would on the device."""
from __future__ import annotations

import json
import logging

import pytest

from voxflow.engine import kernel_compiles
from voxflow.engine.kernel_compiles import KernelCompileWatch

triton = pytest.importorskip("triton", reason="Triton is not installed (a CPU-only install without it)")
tl = triton.language
if kernel_compiles._listener_knobs() is None:
    pytest.skip("this Triton has no compilation listener (triton.knobs.compilation.listener, Triton >= ~3.5)",
                allow_module_level=True)


@triton.jit
def _copy(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)


def _compile(block: int):
    from triton.backends.compiler import GPUTarget
    src = triton.compiler.ASTSource(fn=_copy, signature={"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                    constexprs={"BLOCK": block})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def test_compiles_are_startups_until_serving_then_counted_and_warned_once_per_kernel(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))          # a fresh disk cache: real compiles
    watch, other = KernelCompileWatch().start(), KernelCompileWatch().start()
    assert watch.available
    try:
        _compile(64)                                                        # startup's
        watch.serving()
        assert watch.at_startup["compiles"] == 1 and watch.at_startup["seconds"] > 0
        assert watch.stats() == {"compiles": 0, "cache_loads": 0, "seconds": 0.0, "kernels": {}}
        with caplog.at_level(logging.WARNING, logger="voxflow.engine.kernel_compiles"):
            _compile(128)                                                   # a new specialization while serving
            _compile(128)                                                   # the same again: from the disk cache
        stats = watch.stats()
        assert stats["compiles"] == 1 and stats["cache_loads"] == 1 and stats["seconds"] > 0
        assert stats["kernels"] == {"_copy": 2}
        # one warning for the kernel (other engines still alive in this test process warn for themselves)
        assert watch.warned == ["_copy"]
        assert any("Triton compiled kernel _copy while serving" in r.getMessage() for r in caplog.records)
        assert other.compiles == 2 and other.cache_loads == 1               # every live watch hears every compile
        watch.stop()
        _compile(256)
        assert watch.compiles == 2 and other.compiles == 3                  # a stopped watch no longer counts
    finally:
        watch.stop()
        other.stop()


def _report_compile(name: str, ms: float) -> None:
    """What Triton's compiler tells its listener at the end of a compile of `name` that took `ms`."""
    from triton.knobs import CompileTimes
    triton.knobs.compilation.listener(src=None, metadata={"name": name}, metadata_group={}, cache_hit=False,
                                      times=CompileTimes(ir_initialization=int(ms * 1e3), lowering_stages=[],
                                                         store_results=0))


def test_a_served_step_that_compiles_a_kernel_says_so_in_its_trace_line_and_the_stats(tmp_path, monkeypatch, caplog):
    """The engine's wiring, on the CPU engine: a Triton compile inside a step's prefill (reported to the listener as
    Triton reports it) shows in that step's line (`compiles`, `compile_ms`), one in a prompt build between steps in
    the next line, neither anywhere else; /health's `kernels_compiled_while_serving` counts both, and the engine
    warns once for each kernel. Each line counts how its prefill chunks ran."""
    import voxflow.engine.engine_intake as intake_mod
    from test_engine import drive, greedy, make_engine
    from voxflow.engine.prefill_dispatch import PrefillDispatch
    path = tmp_path / "steps.jsonl"
    core = make_engine(trace_steps=str(path))
    assert core.kernel_compiles.available and core.kernel_compiles.at_startup is not None
    assert core.startup["triton_compiles"] == core.kernel_compiles.at_startup
    run, prefills = PrefillDispatch.run, []

    def run_compiling_first(self, pairs):
        prefills.append(core.steps)
        if len(prefills) == 1:                      # the first prefill compiles a kernel: 250 ms by Triton's clock
            _report_compile("paged_prefill_attention", 250.0)
        return run(self, pairs)
    prepare, builds = intake_mod.prepare_requests, []

    def prepare_compiling_second(model, requests):
        builds.append(core.steps)
        if len(builds) == 2:                        # the second build (between steps) compiles another: 40 ms
            _report_compile("embed_rows", 40.0)
        return prepare(model, requests)
    monkeypatch.setattr(PrefillDispatch, "run", run_compiling_first)
    monkeypatch.setattr(intake_mod, "prepare_requests", prepare_compiling_second)
    reqs = [greedy("Hello there.", 6, voice="vivian", request_id=f"r{i}") for i in range(2)]
    with caplog.at_level(logging.WARNING, logger="voxflow.engine.kernel_compiles"):
        drive(core, {0: reqs[:1], 3: reqs[1:]})
    stats = core.stats()["kernels_compiled_while_serving"]
    core.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_step = {r["step"]: (r["compiles"], r["compile_ms"]) for r in lines if r["compiles"]}
    # the prefill's in its own step; the build made after step builds[1] in the next step's line
    assert by_step == {prefills[0]: (1, 250.0), builds[1] + 1: (1, 40.0)}
    assert stats == {"compiles": 2, "cache_loads": 0, "seconds": 0.29,
                     "kernels": {"paged_prefill_attention": 1, "embed_rows": 1}}
    assert core.kernel_compiles.warned == ["paged_prefill_attention", "embed_rows"]
    logged = [r.getMessage() for r in caplog.records]
    assert any("kernel paged_prefill_attention while serving (250 ms)" in m for m in logged)
    assert any("kernel embed_rows while serving (40 ms)" in m for m in logged)
    # each prefill step ran its chunks one way or the other; steps without prefill ran none
    assert all((r["prefill_graph_runs"] + r["prefill_eager_runs"] > 0) == (r["prefill"] > 0) for r in lines)
    assert sum(r["prefill"] > 0 for r in lines) == 2
