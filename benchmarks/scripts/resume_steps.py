"""The steps of a step trace (engine `trace_steps`) that re-prefilled a preempted request: a step with prefill chunks
that added no request while the queue shrank, and one chunk at most (a wave's new prompts come many at a time).
Prints, per trace, (step, chunks, prompt positions, host prefill phase ms, step wall ms) for each.

    python benchmarks/scripts/resume_steps.py steps_*.jsonl[.gz]
"""
import gzip
import json
import sys


def resume_steps(steps: list[dict]) -> list[tuple]:
    rows = []
    for i in range(1, len(steps) - 1):
        s, before = steps[i], steps[i - 1]
        if s["prefill"] == 1 and not s.get("added") and s["waiting"] < before["waiting"]:
            rows.append((i, s["prefill"], s["prefill_tokens"], round(s["ms"]["prefill"], 2),
                         round((steps[i + 1]["t"] - s["t"]) * 1e3, 2)))
    return rows


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            print(path.rsplit("/", 1)[-1], resume_steps([json.loads(line) for line in f]))
