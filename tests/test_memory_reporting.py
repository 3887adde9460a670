"""The engine's GPU footprint (engine/gpu_memory.py) where users and benchmarks see it: Prometheus gauges, /health's
engine keys, and the results table's memory column (which prefers the total to the older peak of tensors)."""
import importlib.util
import os

from voxflow.api.metrics import Metrics
from voxflow.api.routes_misc import HEALTH_ENGINE_KEYS

GIB = 2 ** 30


def _results_table():
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "scripts", "results_table.py")
    spec = importlib.util.spec_from_file_location("results_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gauges(m: Metrics) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    return {s.name: s.value for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}


def test_gauges_carry_the_engines_footprint():
    m = Metrics()
    m.observe_engine({"alive": True, "stats": {"running": 3, "gpu_memory_used_bytes": 9 * GIB,
                                               "peak_gpu_memory_total_bytes": 10 * GIB, "alloc_retries": 2}})
    got = _gauges(m)
    assert got["voxflow_gpu_memory_used_bytes"] == 9 * GIB
    assert got["voxflow_gpu_memory_peak_total_bytes"] == 10 * GIB
    assert got["voxflow_gpu_allocator_retries"] == 2
    m.observe_engine({"alive": True, "stats": {"gpu_memory_used_bytes": 8 * GIB}})       # later readings update
    assert _gauges(m)["voxflow_gpu_memory_used_bytes"] == 8 * GIB
    cpu = Metrics()                    # a CPU engine reports none: no GPU gauges at all (not a misleading 0)
    cpu.observe_engine({"alive": True, "stats": {"running": 0}})
    assert not any(name.startswith("voxflow_gpu_") for name in _gauges(cpu))


def test_health_shows_the_footprint_keys():
    assert {"gpu_memory_used_bytes", "peak_gpu_memory_total_bytes", "alloc_retries"} <= set(HEALTH_ENGINE_KEYS)


def test_results_table_prefers_the_total_and_marks_older_peaks_as_tensors():
    memory = _results_table()._memory
    offline = {"target": {"engine": {"stats": {"peak_gpu_memory_bytes": 5 * GIB,
                                               "peak_gpu_memory_total_bytes": 9.4 * GIB}}}}
    older = {"target": {"engine": {"stats": {"startup": {"peak_gpu_memory_bytes": int(5.7 * GIB)}}}}}
    http = {"target": {"server_info": {"health_after": {"body": {"engine": {"peak_gpu_memory_total_bytes":
                                                                             int(79.3 * GIB)}}}}}}
    assert memory(offline) == "9.4 GiB total"
    assert memory(older) == "5.7 GiB tensors"
    assert memory(http) == "79.3 GiB total"
    assert memory({"target": {}}) == "—"


def test_a_gauge_counts_the_kernels_the_engine_compiled_while_serving():
    """engine/kernel_compiles.py's stats, as /health carries them: compiles plus disk-cache loads since startup; no
    gauge for an engine that cannot count them (no Triton listener)."""
    m = Metrics()
    m.observe_engine({"alive": True, "stats": {"kernels_compiled_while_serving": {"compiles": 2, "cache_loads": 1,
                                                                                   "seconds": 0.6, "kernels": {}}}})
    assert _gauges(m)["voxflow_engine_kernel_compiles_while_serving"] == 3
    blind = Metrics()
    blind.observe_engine({"alive": True, "stats": {"kernels_compiled_while_serving": {"available": False}}})
    assert "voxflow_engine_kernel_compiles_while_serving" not in _gauges(blind)
