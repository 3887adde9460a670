"""voxflow bench: load generator, metrics, reports and plots for text-to-speech serving.

- workloads.py  prompts (bundled set in prompts/), order, request bodies / engine requests
- client.py     HTTP load generator (closed-loop concurrency, open-loop Poisson), readers.py finds audio bytes
- offline.py    the engine in-process, same load shapes, no HTTP
- metrics.py    per-request records and per-level summaries; continuity.py the simulated real-time player
- report.py     result JSON (schema voxflow.bench/1), schema check, Markdown; plots.py PNGs; compare.py ratios
- cli.py        `voxflow bench ...` / `voxflow bench compare ...` (add_bench_parser, run_bench)
"""
from .report import SCHEMA

__all__ = ["SCHEMA"]
