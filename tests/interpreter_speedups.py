"""Two shortcuts for Triton's interpreter, installed in the interpreter children only (tests/conftest.py, when
TRITON_INTERPRET=1). They change how fast the interpreter runs a kernel, never what it computes:

- xor_sum (the compare-and-swap of tl.sort, which select_tokens' top-p path runs 36 times a 256-wide row) through
  numpy's bitwise_xor.reduce, where the interpreter falls back to combining element by element in Python
  (ReduceOps.generic_reduce: ~25 ms a call). An xor reduction is exact in any order: the same bits.
- A @triton.jit helper called inside a kernel launch does not patch triton.language again when the launch has
  already patched the language modules the helper sees. The interpreter re-walks those modules with
  inspect.getmembers on every helper call, only to set what is set (~a quarter of the code predictor checks' time).

Where this Triton lacks what they wrap, install() leaves the stock interpreter as it is (slower, the same results);
uninstall() puts it back (test_kernel_select_tokens.py holds the two to the same bits).
"""
from __future__ import annotations

import inspect

import numpy as np

_stock: list[tuple[object, str, object]] = []      # (class, attribute, the stock function) while installed


def install() -> bool:
    if _stock:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
        xor_combine = tl.standard._xor_combine
        reduce_ops, launcher, helper = ti.ReduceOps, ti.GridExecutor, ti.InterpretedFunction
        stock_apply, stock_launch, stock_call = reduce_ops.apply_impl, launcher.__call__, helper.__call__
        interpreter_error = ti.InterpreterError
        if not callable(getattr(helper, "rewrite", None)):      # (call() below uses it)
            return False
    except (ImportError, AttributeError):
        return False

    def apply_impl(self, input):
        if self.combine_fn is xor_combine:
            x = input[0]
            return self.to_tensor(np.bitwise_xor.reduce(x.handle.data, axis=self.axis, keepdims=self.keep_dims),
                                  x.dtype)
        return stock_apply(self, input)

    langs_of: dict = {}

    def langs(fn) -> frozenset:
        """The language modules _patch_lang would patch for fn (those among fn's globals)."""
        if fn not in langs_of:                  # (keyed by the function itself: it stays alive, its id unreused)
            langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                     if inspect.ismodule(v) and v in (tl, tl.core))
        return langs_of[fn]

    # The running launch's patched modules (the interpreter runs one launch at a time). A helper's own patching is
    # never undone before the launch ends (the stock call drops its scope), so what it patched counts too.
    active: list[set] = []

    def launch(self, *args, **kwargs):
        active.append(set(langs(self.fn)))
        try:
            return stock_launch(self, *args, **kwargs)
        finally:
            active.pop()

    def call(self, *args, **kwargs):
        mine = langs(self.fn)
        if not (active and mine <= active[-1]):
            if active:
                active[-1] |= mine
            return stock_call(self, *args, **kwargs)
        fn = self.rewrite()                                     # the stock call, less its _patch_lang
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter_error(repr(e)) from e

    for cls, name, new in ((reduce_ops, "apply_impl", apply_impl), (launcher, "__call__", launch),
                           (helper, "__call__", call)):
        _stock.append((cls, name, getattr(cls, name)))
        setattr(cls, name, new)
    return True


def uninstall() -> None:
    while _stock:
        cls, name, stock = _stock.pop()
        setattr(cls, name, stock)
