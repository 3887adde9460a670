"""How many kernels one streamed codec call launches on the GPU path, counted on a CPU.

Why: beside the codec's kernels each of the talker's kernels pays ~1.9 us more (H200 session 35), and a one-frame
codec call was 440 kernels for 2.58 ms (session 28 call 2): the codec's launch count is part of its cost and of the
talker's. No GPU here, so the GPU path is forced onto CPU tensors (every `use_kernels` answers yes; the Triton
kernels run in Triton's interpreter) and counted: Triton launches by kernel, and the PyTorch operations that would
launch a kernel on a GPU (views, shape changes and allocations excluded). A GEMM counts as one launch, as do
F.scaled_dot_product_attention and a cuDNN convolution, though cuBLAS / cuDNN may split one into two or three; so the
totals are a lower bound of the GPU's and comparable between trees, not equal to a GPU profile.

The decoder is the 12 Hz codec's structure (8 attention layers, 16 codebooks, the x2 x2 and x8 x5 x4 x3 upsampling)
with small widths (the counts do not depend on them), fp16, streamed through the codec state pool (gather, decode,
write back) for B streams after one warm-up call:

    TRITON_INTERPRET=1 python benchmarks/scripts/count_codec_launches.py [B] [FRAMES,...] [--where]

--where also lists the PyTorch launches by the voxflow source line that made them (to stderr): where the
launches a kernel could take over are.
"""
import os
import sys
import traceback
from collections import Counter

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# Operations that launch nothing on a GPU (metadata, views, uninitialised allocations).
_NO_LAUNCH = {
    "view", "_unsafe_view", "as_strided", "slice", "select", "t", "transpose", "permute", "expand", "unsqueeze",
    "squeeze", "split", "split_with_sizes", "chunk", "unbind", "detach", "alias", "reshape", "empty", "empty_strided",
    "empty_like", "new_empty", "new_empty_strided", "lift_fresh", "_reshape_alias", "view_as", "narrow", "diagonal",
    "unfold", "_to_copy_view",
    "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "item", "_local_scalar_dense",
    "promote_types", "scalar_tensor",         # dtype arithmetic; a Python number wrapped as a CPU scalar
}


_IN_KERNEL = [0]          # > 0 while an interpreted Triton kernel runs (its own tensor operations are not launches)


class LaunchCounter(TorchDispatchMode):
    """Counts the aten operations a forward dispatches that would be a kernel launch on a GPU (with `where`, also
    by the innermost voxflow source line on the stack)."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.ops = Counter()
        self.sites = Counter() if where else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _NO_LAUNCH and not _IN_KERNEL[0]:
            self.ops[name] += 1
            if self.sites is not None:
                frames = [f for f in traceback.extract_stack() if f"{os.sep}voxflow{os.sep}" in f.filename]
                site = f"{os.path.relpath(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
                self.sites[site, name] += 1
        return func(*args, **(kwargs or {}))


def force_gpu_path() -> Counter:
    """Every voxflow module's `use_kernels` answers yes; returns a Counter of Triton launches by kernel name."""
    import importlib
    import pkgutil

    import voxflow
    from triton.runtime.interpreter import InterpretedFunction
    for info in pkgutil.walk_packages(voxflow.__path__, "voxflow."):
        if info.name.endswith("__main__") or info.name.startswith(
                ("voxflow.api", "voxflow.bench", "voxflow.tools", "voxflow.cli", "voxflow.models.piper")):
            continue
        module = importlib.import_module(info.name)
        if callable(getattr(module, "use_kernels", None)):
            module.use_kernels = lambda t: True
    launches = Counter()
    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        launches[self.fn.__name__] += 1
        _IN_KERNEL[0] += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            _IN_KERNEL[0] -= 1
    InterpretedFunction.run = counted
    return launches


def small_decoder():
    from voxflow.models.qwen3_tts.codec_decoder import CodecDecoder
    from voxflow.models.qwen3_tts.config import CodecDecoderConfig
    cfg = CodecDecoderConfig(codebook_size=64, codebook_dim=32, hidden_size=32, latent_dim=32, head_dim=16,
                             num_attention_heads=2, num_key_value_heads=2, intermediate_size=64, decoder_dim=64)
    torch.manual_seed(0)
    dec = CodecDecoder(cfg).eval().requires_grad_(False)
    for p in dec.parameters():
        p.data.uniform_(0.5, 1.0) if p.dim() == 1 else p.data.normal_(0.0, 0.02)
    return dec.half(), cfg


def main() -> None:
    where = "--where" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--where"]
    batch = int(args[0]) if args else 16
    frames = [int(f) for f in args[1].split(",")] if len(args) > 1 else [1, 25]
    launches = force_gpu_path()
    from voxflow.models.qwen3_tts.codec_pool import CodecStatePool
    dec, cfg = small_decoder()
    pool = CodecStatePool(dec, batch)
    rows = torch.arange(batch)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        pool.step(rows, torch.randint(0, cfg.codebook_size, (batch, cfg.num_quantizers, 2), generator=g))  # warm-up
        print("| frames a call | Triton launches | other launches | total | Triton kernels (launches) |")
        print("|---|---|---|---|---|")
        for n in frames:
            codes = torch.randint(0, cfg.codebook_size, (batch, cfg.num_quantizers, n), generator=g)
            launches.clear()
            with LaunchCounter(where) as ops:
                pool.step(rows, codes)
            triton_total = sum(launches.values())
            other = sum(ops.ops.values())
            kernels = ", ".join(f"{k} {v}" for k, v in launches.most_common())
            print(f"| {n} | {triton_total} | {other} | {triton_total + other} | {kernels} |")
            print("  other:", ", ".join(f"{k} {v}" for k, v in ops.ops.most_common()), file=sys.stderr)
            if ops.sites is not None:
                for (site, name), count in sorted(ops.sites.items()):
                    print(f"    {count:3d} {name:28s} {site}", file=sys.stderr)


if __name__ == "__main__":
    main()
