"""benchmarks/scripts/wave_end_timeline.py's report: per step how busy the talker's and the codec's streams were in
the step's window, which stream is which, and the talker's long gaps with the codec's work around them."""
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "scripts"))

import wave_end_timeline as wet  # noqa: E402

NAMES = ["_select_tokens_kernel", "gemm", "_conv_cl_kernel", "copy"]


def test_busy_counts_overlapping_kernels_once_and_clips_to_the_window():
    rows = [(1, 7, 0.0, 10.0), (1, 7, 5.0, 12.0), (1, 7, 20.0, 30.0), (1, 7, 40.0, 50.0)]
    assert wet.busy(rows, 0.0, 100.0) == 32.0
    assert wet.busy(rows, 8.0, 25.0) == 9.0           # 8..12 and 20..25
    assert wet.busy(rows, 31.0, 39.0) == 0.0


def test_report_splits_each_step_by_stream_and_names_the_talkers_wait(tmp_path, capsys):
    # stream 7: the talker (token draws); stream 33: the codec (convolutions); stream 9: a copy stream
    kernels = [(0, 7, 0.0, 1000.0), (1, 7, 1000.0, 3000.0),          # step 1: talker busy 3 ms
               (2, 33, 500.0, 9000.0),                               # the codec: 8.5 ms across steps 1-2
               (1, 7, 8800.0, 9500.0), (0, 7, 9500.0, 10000.0),      # step 2: the talker waited until 8.8 ms
               (3, 9, 100.0, 200.0)]
    steps = [(1, 0.0, 600.0, {"decode": 12, "prefill_tokens": 152, "codec_launched": 11, "finished": 0}),
             (2, 4000.0, 4100.0, {"decode": 2, "finished": 51}),
             (3, 10000.0, 10100.0, {"decode": 1})]
    path = tmp_path / "wave.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"model": "m", "concurrency": 64, "frames": 40, "engine_args": {}, "names": NAMES,
                   "kernels": kernels, "steps": steps}, f)
    data = json.load(gzip.open(path, "rt"))
    _, talker, codec = wet.streams_of(data)
    assert (talker, codec) == (7, 33)
    wet.report(str(path))
    out = capsys.readouterr().out.splitlines()
    assert "talker stream 7, codec stream 33" in out[0]
    rows = [line.split() for line in out[2:5]]
    # step, host ms (window to the next step's start), decode, prefill, codec+, done, talker ms, codec ms
    assert rows[0] == ["1", "4.00", "12", "152", "11", "0", "3.00", "3.50"]
    assert rows[1] == ["2", "6.00", "2", "0", "0", "51", "1.20", "5.00"]
    gaps = [line for line in out if "us at" in line]
    assert len(gaps) == 1 and "5800.0 us at" in gaps[0] and "gemm -> gemm" in gaps[0]
    assert "stream 33: 1 kernels, its last ends -200.0 us before the gap does" in gaps[0]


def test_record_profiles_a_closed_loop_wave_end_on_the_tiny_checkpoint(tmp_path, capsys):
    """record on the CPU (no CUDA kernels there): from wave 2's last frames on, each step with its trace line; 2
    requests of 12 frames, so the window holds wave 2's two finished requests and then wave 3's prefill; report
    prints one row a step."""
    out = tmp_path / "wave.json.gz"
    wet.record(os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"), 2, str(out), 12,
               {"device": "cpu", "dtype": "float32", "max_num_batched_tokens": 96, "block_size": 4,
                "num_kv_blocks": 256, "prefill_chunk_size": None})
    data = json.load(gzip.open(out, "rt"))
    numbers = [n for n, _, _, _ in data["steps"]]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    lines = [line for _, _, _, line in data["steps"]]
    assert all(line["step"] == n for n, line in zip(numbers, lines))
    assert lines[0]["decode"] == 2 and not lines[0]["prefill"]        # wave 2 mid-flight when profiling starts
    ends = [i for i, line in enumerate(lines) if line["finished"]]
    assert sum(line["finished"] for line in lines) >= 2
    assert any(line["prefill"] for line in lines[ends[0]:])           # then wave 3's prefill
    assert all(start <= end for _, start, end, _ in data["steps"])
    capsys.readouterr()
    wet.report(str(out))
    printed = capsys.readouterr().out.splitlines()[2:]                 # after the heading and the column names
    assert [row.split()[0] for row in printed] == [str(n) for n in numbers]


def test_step_ranges_come_from_the_host_and_annotations_are_not_kernels():
    """split_events: a "wave_step N" range is a step only as the host's range; its device-side copy (the
    profiler's annotation of the step's work on a stream) is neither a step nor a kernel, or it would fill the gaps
    inside the step that the report looks for."""
    import types

    import torch
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device, start, end, stream=-1):
        return types.SimpleNamespace(name=name, device_type=device, device_resource_id=stream,
                                     time_range=types.SimpleNamespace(start=start, end=end))
    events = [event("wave_step 4", cpu, 0.0, 50.0), event("wave_step 4", cuda, 10.0, 900.0, 7),
              event("gemm", cuda, 10.0, 20.0, 7), event("_conv_cl_kernel", cuda, 5.0, 400.0, 33),
              event("aten::mm", cpu, 1.0, 2.0), event("wave_step 3", cpu, -60.0, -10.0),
              event("gemm", cuda, 800.0, 900.0, 7)]
    names, kernels, steps = wet.split_events(events)
    assert steps == [(3, -60.0, -10.0), (4, 0.0, 50.0)]
    assert [(names[k[0]], k[1], k[2]) for k in kernels] == [("_conv_cl_kernel", 33, 5.0), ("gemm", 7, 10.0),
                                                            ("gemm", 7, 800.0)]
