"""benchmarks/scripts/device_take_call.sh: a device call's files into the results tree in one step (the results held
aside put back, the kernel cache taken, r.tgz's folder unpacked into the call's folder, the tables printed), run in
a scratch git checkout with the scripts it calls."""
import glob
import os
import shutil
import subprocess
import sys
import tarfile

ROOT = os.path.join(os.path.dirname(__file__), "..")
SCRIPTS = ("device_take_call.sh", "device_kernel_cache.sh", "device_results_aside.sh", "results_table.py")
RUNS = sorted(glob.glob(os.path.join(ROOT, "benchmarks/results/h100/2026-12-07-session63/call3/h200_0p6b_http_*.gz")))


def _checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "scripts").mkdir(parents=True)
    for name in SCRIPTS:
        shutil.copy(os.path.join(ROOT, "benchmarks", "scripts", name), repo / "benchmarks" / "scripts" / name)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def _call_files(tmp_path):
    """A call's files_at: r.tgz (r/ with two bench results, the A/B table, the GPU tests' log, the tree and card)
    and Triton's cache in one part."""
    files, r = tmp_path / "files_at", tmp_path / "r"
    files.mkdir()
    r.mkdir()
    for p in RUNS[:2]:
        shutil.copy(p, r)
    (r / "ab_0p6b_c64.md").write_text("| http-small-e (baseline) | 1 |\n")
    (r / "gpu_tests.txt").write_text("tests/gpu/x.py .\n1 passed in 60.0s\n")
    (r / "tree.txt").write_text("tree 1234abcd clean\n")
    (r / "gpu.txt").write_text("NVIDIA H200, 580.159.04\n")
    with tarfile.open(files / "r.tgz", "w:gz") as t:
        t.add(r, arcname="r")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kernel.cubin").write_bytes(b"\0" * 64)
    with tarfile.open(files / "triton_cache.tgz.aa", "w:gz") as t:
        t.add(cache, arcname=".")
    return files


def _take(repo, files, dest, aside):
    env = dict(os.environ, VOXFLOW_RESULTS_ASIDE=str(aside), PYTHONPATH=os.path.abspath(ROOT),
               PYTHON=sys.executable)
    return subprocess.run(["bash", "benchmarks/scripts/device_take_call.sh", str(files), dest], cwd=repo, env=env,
                          capture_output=True, text=True)


def test_a_calls_files_land_in_its_folder_with_the_held_results_back_and_the_tables_printed(tmp_path):
    assert len(RUNS) >= 2, "the committed session-63 results this test unpacks"
    repo, files = _checkout(tmp_path), _call_files(tmp_path)
    aside = tmp_path / "aside"                      # results held aside for the call (device_results_aside.sh hold)
    (aside / "h200").mkdir(parents=True)
    (aside / "h200" / "README.md").write_text("held\n")
    dest = "benchmarks/results/h200/2026-12-08-session65/call1"
    done = _take(repo, files, dest, aside)
    assert done.returncode == 0, done.stderr
    assert (repo / "benchmarks/results/h200/README.md").read_text() == "held\n" and not aside.exists()
    got = sorted(p.name for p in (repo / dest).iterdir())
    assert got == sorted([os.path.basename(p) for p in RUNS[:2]] + ["ab_0p6b_c64.md", "gpu.txt", "gpu_tests.txt",
                                                                    "tree.txt"])
    assert os.listdir(repo / ".triton_cache") == ["triton_cache.tgz.aa"]
    out = done.stdout
    assert "tree.txt: tree 1234abcd clean" in out and "gpu.txt: NVIDIA H200" in out
    assert "| call1 | http-small-" in out                     # results_table.py's rows of the two runs
    assert "| http-small-e (baseline) | 1 |" in out and "1 passed in 60.0s" in out
    # a second take into the same folder is refused, as is a folder without r.tgz
    again = _take(repo, files, dest, aside)
    assert again.returncode == 1 and "already holds files" in again.stderr
    (files / "r.tgz").unlink()
    empty = _take(repo, files, "benchmarks/results/h200/2026-12-08-session65/call2", aside)
    assert empty.returncode == 1 and "no r.tgz" in empty.stderr
