"""The fused token-selection kernel == batch_sampling's torch pipeline (fp32 cast, greedy argmax, temperature,
top-k, top-p, counter-based Gumbel-max), id for id, on the CPU through Triton's interpreter (in a subprocess:
TRITON_INTERPRET must be set before triton is first imported; GPU: tests/gpu).

Exact equality holds on these seeds, top-p rows included: the kernel's top-p differs from apply_top_p only at the
nucleus boundary (value ties, ulp-level cumulative sums; see the kernel's docstring), and a draw changes only when
the noise then picks that boundary token (~0.3% of bf16 rows sampling with top-p, from value ties; tests/gpu
checks such rows against a value-threshold nucleus)."""
from __future__ import annotations

import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_SELECT_TOKENS_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def reference(logits, do_sample, temperature, top_k, top_p, keys, frame, codebook, use_top_p):
    """The unfused pipeline the kernel replaces (batch_sampling.select_c0 / residual_sample_fn)."""
    from voxflow.models.qwen3_tts.batch_sampling import gumbel_argmax
    from voxflow.models.qwen3_tts.sampling import WarpParams, warp_logits
    l32 = logits.to(torch.float32)
    greedy = l32.argmax(dim=-1)
    params = WarpParams(do_sample, temperature, top_k, top_p, top_k_max=None, any_top_p=use_top_p)
    sampled = gumbel_argmax(warp_logits(l32, params), keys, frame, codebook)
    return torch.where(do_sample, sampled, greedy)


def make_case(g, batch, vocab, dtype, use_top_p, device="cpu"):
    """Mixed greedy / sampling rows with the settings users pick, -inf entries and value ties."""
    logits = torch.randn(batch, vocab, generator=g) * 2.5
    if vocab > 2048:                            # the talker: only codes and EOS, EOS sometimes masked (min length)
        from voxflow.models.qwen3_tts.sampling import CODEC_EOS_ID, suppress_mask
        logits.masked_fill_(suppress_mask(vocab), float("-inf"))
        logits[1::3, CODEC_EOS_ID] = float("-inf")
    else:                                       # a few scattered -inf entries
        logits[torch.rand(batch, vocab, generator=g) < 0.01] = float("-inf")
    logits[0, 5] = logits[0, 9] = logits[0].max() + 1.0     # a tied maximum: lowest index wins (greedy, top_k=1)
    logits[-1, :64] = logits[-1].max() + 0.25                # a plateau of 64 ties across the top-k boundary (40)
    do_sample = torch.rand(batch, generator=g) < 0.75
    do_sample[0] = do_sample[-1] = True
    pick = lambda options, dt: torch.tensor(options, dtype=dt)[torch.randint(0, len(options), (batch,), generator=g)]
    temperature = pick([0.9, 1.0, 1.3], torch.float32)
    top_k = pick([0, 1, 50, vocab, vocab + 7], torch.long)
    top_k[0], top_k[-1] = 1, 40
    top_p = pick([1.0, 0.8, 0.95], torch.float64)
    top_p[-1] = 1.0     # (a nucleus boundary inside the plateau would hit the documented tie difference)
    if not use_top_p:                           # the caller's contract: no sampling row uses top-p
        top_p = torch.where(do_sample, torch.ones_like(top_p), top_p)
    keys = torch.randint(0, 2 ** 32, (batch,), generator=g)
    frame = torch.randint(0, 4096, (batch,), generator=g)
    frame[0] = 2 ** 40 + 3                      # wraps like the reference's 32-bit mask
    return [t.to(device) for t in (logits.to(dtype), do_sample, temperature, top_k, top_p, keys, frame)]


def check_interpreter_shortcuts_change_no_bits():
    """tests/interpreter_speedups.py (installed in every interpreter child): top-p draws (tl.sort's xor reductions)
    and top-k draws (the radix select's helpers) give the same codes and embedding rows with the shortcuts as with
    the stock interpreter."""
    import interpreter_speedups                                 # tests/interpreter_speedups.py
    from voxflow.kernels.select_tokens import select_tokens
    g = torch.Generator().manual_seed(21)
    table = torch.randn(256, 8, generator=g)
    results = []
    try:
        for shortcuts in (True, False):
            if shortcuts:
                assert interpreter_speedups.install()
            else:
                interpreter_speedups.uninstall()
            for use_top_p in (True, False):
                case = make_case(torch.Generator().manual_seed(22), 3, 256, torch.bfloat16, use_top_p)
                rows = torch.zeros(3, 8)
                results.append((select_tokens(*case, 4, use_top_p, embed=table, embed_out=rows), rows))
    finally:
        reinstalled = interpreter_speedups.install()        # (the child's later tests keep the shortcuts)
    assert reinstalled
    for (got, got_rows), (want, want_rows) in zip(results[:2], results[2:]):
        assert torch.equal(got, want) and torch.equal(got_rows, want_rows)


def check_matches_reference():
    from voxflow.kernels.select_tokens import select_tokens, supported
    g = torch.Generator().manual_seed(0)
    for vocab in (2048, 3072):
        for dtype in (torch.float32, torch.bfloat16):
            for use_top_p, codebook in ((False, 1), (True, 0 if vocab > 2048 else 15)):
                args = make_case(g, 12, vocab, dtype, use_top_p)
                assert supported(args[0])
                got = select_tokens(*args, codebook, use_top_p)
                want = reference(*args, codebook, use_top_p)
                assert got.dtype == torch.long and got.shape == want.shape
                assert torch.equal(got, want), (vocab, dtype, use_top_p, (got != want).nonzero().flatten().tolist())


def check_radix_widths_agree():
    """The top-k radix select decided 1, 2 or 4 bits a pass (select_tokens.RADIX_BITS, 2 by default): the same
    k-th largest, hence the same ids as the reference (negative values, -inf entries, ties across the boundary,
    k = 1 and k >= V in the case)."""
    import voxflow.kernels.select_tokens as module
    from voxflow.kernels.select_tokens import select_tokens
    g = torch.Generator().manual_seed(5)
    # fp32 logits decide all 32 key bits, bf16 and fp16 ones only their significant ones (select_tokens.key_bits);
    # over 16 bits, with and without the stop after the top 16 (select_tokens.HALF_EXIT)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        args = make_case(g, 12, 2048, dtype, False)
        want = reference(*args, 3, False)
        for bits in (1, 2, 4):
            for half_exit in (True, False) if dtype != torch.bfloat16 else (True,):
                saved, module.HALF_EXIT = module.HALF_EXIT, half_exit
                try:
                    got = select_tokens(*args, 3, False, radix_bits=bits)
                finally:
                    module.HALF_EXIT = saved
                assert torch.equal(got, want), (dtype, bits, half_exit, (got != want).nonzero().flatten().tolist())


def check_kth_value_from_16_bit_logits():
    """Rows built so that only the top-k threshold decides the draw: k = 40 and 50 values above a tail, all
    negative or all positive, a few ulps apart around the k-th: with too few key bits decided, or a positive
    threshold's low key bits set (above the k-th value), the threshold lands off the k-th value and ids differ. (A
    negative threshold's low bits only move it by less than an ulp of the logits' dtype, which no 16-bit value
    lies within; the -inf thresholds of the reference cases check them: k >= the finite values.)"""
    from voxflow.kernels.select_tokens import select_tokens
    g = torch.Generator().manual_seed(11)
    for dtype in (torch.bfloat16, torch.float16):
        for sign in (1.0, -1.0):
            base = torch.full((8, 2048), -30.0)
            top = 3.0 + torch.arange(64, dtype=torch.float32) * (2.0 ** -8 if dtype == torch.float16 else 2.0 ** -5)
            for r in range(8):
                base[r, torch.randperm(2048, generator=g)[:64]] = sign * top
            logits = base.to(dtype)
            n = logits.shape[0]
            do_sample = torch.ones(n, dtype=torch.bool)
            temperature = torch.full((n,), 0.9)
            top_k = torch.tensor([40, 50, 1, 63, 64, 65, 2, 39])
            top_p = torch.ones(n, dtype=torch.float64)
            keys, frame = torch.arange(n) * 7919, torch.arange(n)
            args = (logits, do_sample, temperature, top_k, top_p, keys, frame)
            want = reference(*args, 2, False)
            got = select_tokens(*args, 2, False)
            assert torch.equal(got, want), (dtype, sign, (got != want).nonzero().flatten().tolist())


def check_talker_draw_keeps_all_key_bits():
    """The talker's draw processes bf16 logits in fp32 (the repetition penalty: x / p), so its values have low bits
    and its radix select must decide all 32 key bits (select_tokens.key_bits(talker=True)). Each row: one seen id a
    with logit L, penalised to L / p, the top-1; an unseen id b at L / p truncated to bf16, just below it. With k =
    1 only a survives; a threshold from 16 key bits would be that truncation and keep b too (drawn about half the
    time)."""
    from voxflow.kernels.select_tokens import select_tokens
    from voxflow.models.qwen3_tts.sampling import CODEC_EOS_ID, suppress_mask
    n, vocab, a, b = 16, 3072, 7, 11
    logit = (3.0 + torch.arange(n) / 8).to(torch.bfloat16).float()
    penalty = torch.full((n,), 1.05)
    penalised = logit / penalty
    below = (penalised.view(torch.int32) & ~0xFFFF).view(torch.float32)        # truncated to bf16 (positive)
    assert (below < penalised).all()                       # (1.05: no row divides exactly)
    raw = torch.full((n, vocab), -30.0)
    raw[:, a], raw[:, b] = logit, below
    raw = raw.to(torch.bfloat16)
    assert torch.equal(raw[:, b].float(), below)
    seen = torch.zeros(n, vocab, dtype=torch.bool)
    seen[:, a] = True
    do_sample = torch.ones(n, dtype=torch.bool)
    got = select_tokens(raw, do_sample, torch.full((n,), 0.9), torch.ones(n, dtype=torch.long),
                        torch.ones(n, dtype=torch.float64), torch.arange(n) * 104729, torch.arange(n), 0, False,
                        talker=(seen, penalty, torch.full((n,), 5), torch.zeros(n, dtype=torch.long),
                                suppress_mask(vocab), CODEC_EOS_ID))
    assert (got == a).all(), got.tolist()


def check_talker_processing_matches_select_c0():
    """talker=: the c0 draw from RAW talker logits equals batch_sampling.select_c0's torch path (repetition penalty
    on seen ids, EOS barred before min_new_tokens, suppression, then the draw)."""
    from voxflow.kernels.select_tokens import select_tokens
    from voxflow.models.qwen3_tts.sampling import CODEC_EOS_ID, process_talker_logits, suppress_mask
    g = torch.Generator().manual_seed(3)
    vocab = 3072
    for dtype in (torch.float32, torch.bfloat16):
        raw = (torch.randn(10, vocab, generator=g) * 2.5).to(dtype)
        raw[:, CODEC_EOS_ID] = raw.max() + 1.0                       # EOS would win wherever it is allowed
        _, do_sample, temperature, top_k, top_p, keys, frame = make_case(g, 10, vocab, dtype, False)
        seen = torch.rand(10, vocab, generator=g) < 0.05
        penalty = torch.tensor([1.0, 1.05, 1.3, 2.0, 1.05] * 2, dtype=torch.float32)
        num_generated = torch.tensor([0, 3, 10, 2, 50] * 2)
        min_new_tokens = torch.tensor([2, 2, 2, 2 ** 62, 0] * 2)      # rows 0, 3, 5, 8 too early: EOS barred
        suppress = suppress_mask(vocab)
        processed = process_talker_logits(raw, seen, num_generated, penalty, min_new_tokens, suppress, CODEC_EOS_ID)
        want = reference(processed, do_sample, temperature, top_k, top_p, keys, frame, 0, False)
        got = select_tokens(raw, do_sample, temperature, top_k, top_p, keys, frame, 0, False,
                            talker=(seen, penalty, num_generated, min_new_tokens, suppress, CODEC_EOS_ID))
        assert torch.equal(got, want), (dtype, (got != want).nonzero().flatten().tolist())
        # seen read in place from a whole table (seen_rows: the slots' rows, in batch order, two on one row)
        table = torch.rand(14, vocab, generator=g) < 0.05
        slots = torch.tensor([9, 2, 13, 0, 5, 7, 11, 3, 3, 6])
        table[slots[:8]] = seen[:8]
        seen_of_slots = table[slots]
        want_rows = reference(process_talker_logits(raw, seen_of_slots, num_generated, penalty, min_new_tokens,
                                                    suppress, CODEC_EOS_ID),
                              do_sample, temperature, top_k, top_p, keys, frame, 0, False)
        got_rows = select_tokens(raw, do_sample, temperature, top_k, top_p, keys, frame, 0, False,
                                 talker=(table, penalty, num_generated, min_new_tokens, suppress, CODEC_EOS_ID, slots))
        assert torch.equal(got_rows, want_rows) and torch.equal(got_rows[:8], got[:8])
        greedy = ~do_sample
        too_early = num_generated < min_new_tokens
        assert ((got[greedy & ~too_early] == CODEC_EOS_ID).all() and (got[too_early] != CODEC_EOS_ID).all())


def check_single_rows_and_codebooks():
    """B = 1 (the latency case) over several codebooks and frames: the noise counters reach the kernel intact."""
    from voxflow.kernels.select_tokens import select_tokens
    g = torch.Generator().manual_seed(1)
    logits, do_sample, temperature, top_k, top_p, keys, frame = make_case(g, 1, 2048, torch.float32, True)
    top_k[0], top_p[0] = 0, 0.95
    for codebook in (1, 2, 7, 15):
        for f in (0, 1, 12345):
            frame.fill_(f)
            got = select_tokens(logits, do_sample, temperature, top_k, top_p, keys, frame, codebook, True)
            assert torch.equal(got, reference(logits, do_sample, temperature, top_k, top_p, keys, frame, codebook,
                                              True)), (codebook, f)


def check_embedding_rows_copied():
    """embed= / embed_out=: the same ids, and each row's drawn id's table row copied bit for bit (a table wider
    than the copy block: 2 x 1024 + 40 columns, more rows than the vocabulary; bf16 and fp32); with embed2= too,
    both tables' rows."""
    from voxflow.kernels.select_tokens import select_tokens
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.bfloat16, torch.float32):
        args = make_case(g, 5, 2048, torch.bfloat16, False)
        table = torch.randn(2050, 2088, generator=g).to(dtype)
        rows = torch.full((5, 2088), float("nan"), dtype=dtype)
        got = select_tokens(*args, 4, False, embed=table, embed_out=rows)
        assert torch.equal(got, reference(*args, 4, False))
        assert torch.equal(rows, table[got]), dtype
    # embed2= / embed2_out=: a second table's rows too, of another width (the code predictor's projected inputs)
    args = make_case(g, 3, 2048, torch.bfloat16, False)
    table, table2 = torch.randn(2048, 96, generator=g), torch.randn(2048, 40, generator=g)
    rows, rows2 = torch.full((3, 96), float("nan")), torch.full((3, 40), float("nan"))
    got = select_tokens(*args, 5, False, embed=table, embed_out=rows, embed2=table2, embed2_out=rows2)
    assert torch.equal(got, reference(*args, 5, False))
    assert torch.equal(rows, table[got]) and torch.equal(rows2, table2[got])


def check_row_scale_is_scale_rows_first():
    """row_scale=(x, eps) (the code predictor's head with its final norm folded in): the same ids and copied rows as
    the kernel without it on the logits folded_norms.scale_rows made (each row times x's RMSNorm factor, rounded to
    the logits' dtype) -- greedy, top-k and top-p rows, bf16 and fp32, rows of very different norms; and the scale
    matters (the unscaled logits draw other ids)."""
    from voxflow.kernels.select_tokens import select_tokens
    from voxflow.layers.folded_norms import scale_rows
    g = torch.Generator().manual_seed(12)
    for dtype, use_top_p in ((torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)):
        logits, *rest = make_case(g, 6, 2048, dtype, use_top_p)
        x = (torch.randn(6, 96, generator=g) * torch.tensor([[0.05], [1.0], [3.0], [0.3], [10.0], [0.7]])).to(dtype)
        table = torch.randn(2048, 40, generator=g).to(dtype)
        rows, want_rows = torch.empty(6, 40, dtype=dtype), torch.empty(6, 40, dtype=dtype)
        got = select_tokens(logits, *rest, 3, use_top_p, embed=table, embed_out=rows, row_scale=(x, 1e-6))
        want = select_tokens(scale_rows(logits, x, 1e-6), *rest, 3, use_top_p, embed=table, embed_out=want_rows)
        assert torch.equal(got, want) and torch.equal(rows, want_rows), (dtype, use_top_p)
        unscaled = select_tokens(logits, *rest, 3, use_top_p)
        assert not torch.equal(unscaled, got), "the scale changed no draw: the case lost its point"


def check_supported():
    from voxflow.kernels.select_tokens import supported
    assert supported(torch.zeros(2, 3072, dtype=torch.bfloat16)) and supported(torch.zeros(1, 4096))
    assert supported(torch.zeros(4, 2048, dtype=torch.float16))
    assert not supported(torch.zeros(2, 4097))                       # the row must fit in registers
    assert not supported(torch.zeros(3, 2048)[:, ::2])                # unit last stride
    assert not supported(torch.zeros(2048)) and not supported(torch.zeros(2, 2, 16))
    assert not supported(torch.zeros(2, 2048, dtype=torch.float64))


if IN_CHILD:
    def test_child_talker_processing():
        check_talker_processing_matches_select_c0()

    def test_child_interpreter_shortcuts_change_no_bits():
        check_interpreter_shortcuts_change_no_bits()

    def test_child_matches_reference():
        check_matches_reference()

    def test_child_single_rows_and_codebooks():
        check_single_rows_and_codebooks()

    def test_child_radix_widths_agree():
        check_radix_widths_agree()

    def test_child_kth_value_from_16_bit_logits():
        check_kth_value_from_16_bit_logits()

    def test_child_talker_draw_keeps_all_key_bits():
        check_talker_draw_keeps_all_key_bits()

    def test_child_supported():
        check_supported()

    def test_child_embedding_rows_copied():
        check_embedding_rows_copied()

    def test_child_row_scale_is_scale_rows_first():
        check_row_scale_is_scale_rows_first()
else:
    def test_select_tokens_kernel_under_the_interpreter_matches_reference():
        run_child(__file__, CHILD_FLAG)

    def test_select_tokens_rejects_an_embedding_table_of_the_wrong_shape():
        from voxflow.kernels.select_tokens import select_tokens
        row = torch.zeros(2, dtype=torch.long)
        args = (torch.zeros(2, 2048), row.bool(), row.float(), row, row.double(), row, row, 1, False)
        for table, out in ((torch.zeros(2047, 8), torch.zeros(2, 8)),                  # fewer rows than the vocab
                           (torch.zeros(2048, 8), torch.zeros(2, 8, dtype=torch.bfloat16)),   # another dtype
                           (torch.zeros(2048, 8), torch.zeros(3, 8))):                 # not [B, D]
            with pytest.raises(ValueError, match="embed"):
                select_tokens(*args, embed=table, embed_out=out)
        with pytest.raises(ValueError, match="together"):
            select_tokens(*args, embed=torch.zeros(2048, 8))
        good = dict(embed=torch.zeros(2048, 8), embed_out=torch.zeros(2, 8))
        with pytest.raises(ValueError, match="embed2"):                # the second table checked the same way
            select_tokens(*args, **good, embed2=torch.zeros(2047, 4), embed2_out=torch.zeros(2, 4))
        with pytest.raises(ValueError, match="embed2 comes with embed"):
            select_tokens(*args, embed2=torch.zeros(2048, 4), embed2_out=torch.zeros(2, 4))
        for bad in (torch.zeros(3, 8), torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(8, 2).t(),
                    torch.zeros(2, 4097)):                              # rows, dtype, stride, width
            with pytest.raises(ValueError, match="row_scale"):
                select_tokens(*args, row_scale=(bad, 1e-6))

    def test_key_bits_cover_what_an_fp32_value_from_each_dtype_can_differ_in(monkeypatch):
        import voxflow.kernels.select_tokens as select_tokens_module
        from voxflow.kernels.select_tokens import key_bits
        assert [key_bits(torch.bfloat16, False, b) for b in (1, 2, 4)] == [16, 16, 16]
        assert [key_bits(torch.float16, False, b) for b in (1, 2, 4)] == [19, 20, 20]
        assert [key_bits(torch.float32, False, b) for b in (1, 2, 4)] == [32, 32, 32]
        assert key_bits(torch.bfloat16, True, 2) == 32            # the talker's processed logits: any fp32 value
        monkeypatch.setattr(select_tokens_module, "FULL_KEYS", True)      # the A/B switch: all bits, every dtype
        assert key_bits(torch.bfloat16, False, 2) == key_bits(torch.float16, False, 4) == 32
        for dtype, bits in ((torch.bfloat16, 16), (torch.float16, 19)):   # the claim itself, on every value
            values = torch.arange(2 ** 16, dtype=torch.int32).to(torch.int16).view(dtype).float()
            values = values[torch.isfinite(values) | torch.isinf(values)]
            assert (values.view(torch.int32) & ((1 << (32 - bits)) - 1) == 0).all()

    def test_select_tokens_rejects_radix_widths_other_than_1_2_4():
        from voxflow.kernels.select_tokens import select_tokens
        row = torch.zeros(1, dtype=torch.long)
        with pytest.raises(ValueError, match="radix_bits"):
            select_tokens(torch.zeros(1, 2048), row.bool(), row.float(), row, row.double(), row, row, 1, False,
                          radix_bits=3)


def test_select_c0_reads_seen_rows_of_a_whole_table_on_the_torch_path():
    """batch_sampling.select_c0 with seen_rows (the decode step's call): on a CPU the torch path gathers the rows
    itself, so its ids equal those from the gathered [B, V] rows."""
    from voxflow.models.qwen3_tts.batch_sampling import select_c0
    from voxflow.models.qwen3_tts.sampling import CODEC_EOS_ID, WarpParams, suppress_mask
    g = torch.Generator().manual_seed(11)
    vocab, b = 3072, 6
    raw = torch.randn(b, vocab, generator=g) * 2.5
    table = torch.rand(9, vocab, generator=g) < 0.05
    slots = torch.tensor([4, 0, 8, 2, 2, 7])
    params = WarpParams(torch.tensor([True, False] * 3), torch.full((b,), 0.9), torch.full((b,), 50),
                        torch.ones(b, dtype=torch.float64), any_top_p=False)
    args = (torch.full((b,), 5), torch.full((b,), 1.3), torch.zeros(b, dtype=torch.long), suppress_mask(vocab),
            params, torch.arange(b), torch.full((b,), 3), CODEC_EOS_ID)
    want = select_c0(raw, table[slots], *args)
    assert torch.equal(select_c0(raw, table, *args, seen_rows=slots), want)
    assert not torch.equal(select_c0(raw, table, *args, seen_rows=slots.flip(0)), want)
