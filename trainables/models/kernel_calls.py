"""Checked entries of the compiled CPU kernels (:mod:`ckernels` builds and loads them).

Every entry takes tensors, never addresses: it derives the sizes the C function needs
from them and checks each tensor's device (CPU), dtype, layout (contiguous, or for the
evaluation cell K contiguous member blocks) and shape against those sizes, and the values
of every index tensor (targets, tokens, step counts) against the range the C code indexes
with them, before the C code reads or writes a byte. A mismatch raises
:class:`KernelCallError` naming the entry, the argument, what it must be and what it was:
the C functions trust their arguments, so a wrong tensor would otherwise read or write
memory it does not own. The checks cost tens of microseconds per call (the training LSTM
layer's 11 tensors: about 40 us on a loaded 2-core machine), about 0.3 ms of a 50-65 ms
K=8 training step of the paper's model.

The C signatures and layouts are documented in the sources under :file:`kernels/`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

MAX_HIDDEN = 1024
"""Largest hidden size the LSTM layer kernels take (the backward's zero row, ``lstm_seq.c``)."""

_F = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_long
_I64 = ctypes.c_int64
F32, I64, I32, BOOL = torch.float32, torch.int64, torch.int32, torch.bool


class KernelCallError(ValueError):
    """A tensor handed to a compiled kernel does not fit it (device, dtype, layout, shape or
    index range). A bug in the calling code (the seq2seq model, or a plugin calling the
    kernels), caught before the C code touches memory; not a user input error."""


def _bind(fn: Any, argtypes: list[Any], restype: Any = None) -> Any:
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


def _describe(x: torch.Tensor) -> str:
    layout = "contiguous" if x.is_contiguous() else f"strides {tuple(x.stride())}"
    return f"{x.dtype} {tuple(x.shape)} on {x.device.type}, {layout}"


def _tensor(entry: str, name: str, x: Any, dtype: torch.dtype, shape: Sequence[int]) -> int:
    """The address of ``x`` after checking it is a contiguous ``dtype`` CPU tensor of ``shape``."""
    want = tuple(int(s) for s in shape)
    if not isinstance(x, torch.Tensor):
        raise KernelCallError(
            f"{entry}: {name} must be a tensor, got {type(x).__name__}. Fix: pass a "
            f"contiguous {dtype} CPU tensor of shape {want}"
        )
    if x.device.type != "cpu" or x.dtype != dtype or tuple(x.shape) != want or not x.is_contiguous():
        raise KernelCallError(
            f"{entry}: {name} must be a contiguous {dtype} CPU tensor of shape {want}, got "
            f"{_describe(x)}. Fix: the caller must pass it so (.contiguous(), .to({dtype}), "
            "the shapes the kernel's header documents), or run the torch ops instead"
        )
    return int(x.data_ptr())


def _optional(entry: str, name: str, x: Any, dtype: torch.dtype, shape: Sequence[int]) -> int | None:
    """:func:`_tensor`, or None (a NULL pointer) for no tensor."""
    return None if x is None else _tensor(entry, name, x, dtype, shape)


def _blocks(entry: str, name: str, x: Any, shape: Sequence[int]) -> tuple[int, int]:
    """Address and member stride of a float32 CPU tensor of ``shape`` (K, B, F) made of K
    contiguous, non-overlapping (B, F) blocks (any member stride)."""
    k, b, f = (int(s) for s in shape)
    ok = (
        isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype == F32
        and tuple(x.shape) == (k, b, f) and (b * f == 0 or (x.stride(2) == 1 and x.stride(1) == f))
        and (k <= 1 or x.stride(0) >= b * f)
    )
    if not ok:
        got = _describe(x) if isinstance(x, torch.Tensor) else type(x).__name__
        raise KernelCallError(
            f"{entry}: {name} must be a float32 CPU tensor of shape {(k, b, f)} made of {k} "
            f"contiguous ({b}, {f}) blocks, got {got}. Fix: pass each member's rows "
            "contiguous (or run the torch ops)"
        )
    return int(x.data_ptr()), int(x.stride(0))


def _in_range(entry: str, name: str, x: torch.Tensor, hi: int, ignore: int | None = None,
              where: torch.Tensor | None = None) -> None:
    """Every value of ``x`` (where ``where`` is true) is in ``[0, hi)`` or equals ``ignore``:
    the C code indexes with it."""
    bad = (x < 0) | (x >= hi)
    if ignore is not None:
        bad &= x != ignore
    if where is not None:
        bad &= where
    if bool(bad.any()):
        value = int(x[bad].flatten()[0])
        allowed = f"[0, {hi})" + (f" or {ignore}" if ignore is not None else "")
        raise KernelCallError(
            f"{entry}: {name} holds {value}, outside {allowed}, which the kernel would index "
            f"memory with. Fix: the caller must pass values in {allowed}"
        )


def _steps(entry: str, active: Sequence[int] | None, t_len: int, rows: int) -> Any:
    """``active`` (T row counts, each in [0, rows]; None or empty: every row) as a C int array."""
    if not active:
        return None
    if len(active) != t_len or any(not 0 <= int(n) <= rows for n in active):
        raise KernelCallError(
            f"{entry}: active must hold {t_len} row counts in [0, {rows}], got {tuple(active)}. "
            "Fix: pass one count per time step (Seq2SeqBatch.tgt_active / src_active)"
        )
    return (ctypes.c_int * t_len)(*(int(n) for n in active))


def _hidden(entry: str, hidden: int) -> None:
    if hidden > MAX_HIDDEN:
        raise KernelCallError(
            f"{entry}: hidden size {hidden} is above the kernels' {MAX_HIDDEN}. Fix: run the "
            "torch ops for this layer (ckernels.applicable returns None for it)"
        )


class CpuKernels:
    """The compiled kernels of one library, as checked entries (see the module doc);
    ``flags`` are the compiler flags it was built with, ``path`` the library file."""

    def __init__(self, lib: ctypes.CDLL, path: Path, flags: tuple[str, ...]) -> None:
        self.path = path
        self.flags = flags
        self._eval_step = _bind(lib.lstm_eval_step, [_I, _I, _I, _F, _L, _F, _L, _F, _F, _L])
        self._fwd_seq = _bind(lib.lstm_fwd_seq, [_I] * 5 + [_F] * 11)
        self._bwd_seq = _bind(lib.lstm_bwd_seq, [_I] * 5 + [_F] * 19)
        self._argmax = _bind(lib.logits_argmax, [_I, _I, _F, _F])
        self._ce = _bind(lib.logits_ce, [_I, _I, _F, _F, _I64, _F, _F])
        self._softmax_ce = _bind(lib.logits_softmax_ce, [_I, _I, _F, _F, _I64, _F, _F, _F])
        self._ce_grad = _bind(lib.logits_ce_grad, [_I, _I, _F, _F, _F, _I64, _F, _F])
        self._out_fwd = _bind(lib.out_fwd, [_I] * 5 + [_F] * 4 + [_I64] + [_F] * 3, ctypes.c_int)
        self._out_bwd = _bind(lib.out_bwd, [_I] * 4 + [_F] * 3 + [_I64] + [_F] * 6)
        self._attend_one = _bind(lib.attend_one, [_I] * 5 + [_F] * 5)
        self._decode = _bind(lib.decode_batch, [_I] * 12 + [_I64] + [_F] * 20, ctypes.c_int)

    def __deepcopy__(self, memo: dict[int, Any]) -> CpuKernels:
        return self  # immutable: a copied model shares its library

    def __reduce__(self) -> tuple[Any, ...]:
        from trainables.models.ckernels import reopen

        return reopen, (str(self.path), self.flags)

    @property
    def portable(self) -> bool:
        """Whether the library was built without a flag naming the build machine's CPU."""
        from trainables.models.ckernels import NATIVE_FLAGS

        return not any(f in NATIVE_FLAGS for f in self.flags)

    # ------------------------------------------------------------------ LSTM layers
    def eval_step(self, z: torch.Tensor, c2_prev: torch.Tensor, c2_out: torch.Tensor,
                  h_out: torch.Tensor) -> None:
        """``lstm_eval_step``: z (K, B, 4H), the doubled cells c2_prev, c2_out and h_out (K,
        B, H), each K contiguous (B, .) blocks; c2_out and h_out with one member stride;
        c2_out may be c2_prev (in place)."""
        e = "lstm_eval_step"
        k, b, g4 = _shape(e, "z", z, 3)
        if g4 % 4:
            raise KernelCallError(f"{e}: z must be (K, B, 4H), got {tuple(z.shape)}. Fix: pass the four gates' pre-activations")
        h = g4 // 4
        pz, sz = _blocks(e, "z", z, (k, b, g4))
        pc, sc = _blocks(e, "c2_prev", c2_prev, (k, b, h))
        po, so = _blocks(e, "c2_out", c2_out, (k, b, h))
        ph, sh = _blocks(e, "h_out", h_out, (k, b, h))
        if so != sh:
            raise KernelCallError(f"{e}: c2_out and h_out must share one member stride, got {so} and {sh}. Fix: allocate them alike")
        self._eval_step(k, b, h, pz, sz, pc, sc, po, ph, so)

    def fwd_seq(self, x: torch.Tensor, w_ih_t: torch.Tensor, bias: torch.Tensor | None,
                w_hh_t: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor,
                active: Sequence[int] | None, act: torch.Tensor, cs: torch.Tensor,
                tcs: torch.Tensor, hs: torch.Tensor) -> None:
        """``lstm_fwd_seq``: x (K, T, B, E), w_ih_t (K, E, 4H), bias (K, 1, 4H) or None,
        w_hh_t (K, H, 4H), h0, c0 (K, B, H) -> act (K, T, B, 4H), cs, tcs, hs (K, T, B, H)."""
        e = "lstm_fwd_seq"
        k, t, b, n_in = _shape(e, "x", x, 4)
        h = _shape(e, "w_hh_t", w_hh_t, 3)[1]
        g = 4 * h
        _hidden(e, h)
        args = [
            _tensor(e, "x", x, F32, (k, t, b, n_in)), _tensor(e, "w_ih_t", w_ih_t, F32, (k, n_in, g)),
            _optional(e, "bias", bias, F32, (k, 1, g)), _tensor(e, "w_hh_t", w_hh_t, F32, (k, h, g)),
            _tensor(e, "h0", h0, F32, (k, b, h)), _tensor(e, "c0", c0, F32, (k, b, h)),
            _steps(e, active, t, b), _tensor(e, "act", act, F32, (k, t, b, g)),
            *(_tensor(e, n, v, F32, (k, t, b, h)) for n, v in (("cs", cs), ("tcs", tcs), ("hs", hs))),
        ]
        self._fwd_seq(k, t, b, h, n_in, *args)

    def bwd_seq(self, x: torch.Tensor, h0: torch.Tensor, hs: torch.Tensor, w_ih: torch.Tensor,
                w_hh: torch.Tensor, dhs: torch.Tensor | None, dcs: torch.Tensor | None,
                act: torch.Tensor, cs: torch.Tensor, tcs: torch.Tensor, c0: torch.Tensor,
                active: Sequence[int] | None, d_gates: torch.Tensor, dx: torch.Tensor,
                dh: torch.Tensor, dc: torch.Tensor, dw_ih: torch.Tensor, dw_hh: torch.Tensor,
                d_bias: torch.Tensor | None) -> None:
        """``lstm_bwd_seq`` (shapes as :meth:`fwd_seq`; w_ih (K, 4H, E), w_hh (K, 4H, H),
        dhs, dcs (K, T, B, H) or None) -> d_gates, dx, dh, dc (K, B, H), dw_ih, dw_hh and
        d_bias (K, 1, 4H) unless None."""
        e = "lstm_bwd_seq"
        k, t, b, n_in = _shape(e, "x", x, 4)
        g, h = _shape(e, "w_hh", w_hh, 3)[1:]
        _hidden(e, h)
        seq, state = (k, t, b, h), (k, b, h)
        args = [
            _tensor(e, "x", x, F32, (k, t, b, n_in)), _tensor(e, "h0", h0, F32, state),
            _tensor(e, "hs", hs, F32, seq), _tensor(e, "w_ih", w_ih, F32, (k, 4 * h, n_in)),
            _tensor(e, "w_hh", w_hh, F32, (k, 4 * h, h)), _optional(e, "dhs", dhs, F32, seq),
            _optional(e, "dcs", dcs, F32, seq), _tensor(e, "act", act, F32, (k, t, b, g)),
            _tensor(e, "cs", cs, F32, seq), _tensor(e, "tcs", tcs, F32, seq),
            _tensor(e, "c0", c0, F32, state), _steps(e, active, t, b),
            _tensor(e, "d_gates", d_gates, F32, (k, t, b, g)),
            _tensor(e, "dx", dx, F32, (k, t, b, n_in)), _tensor(e, "dh", dh, F32, state),
            _tensor(e, "dc", dc, F32, state), _tensor(e, "dw_ih", dw_ih, F32, (k, g, n_in)),
            _tensor(e, "dw_hh", dw_hh, F32, (k, g, h)), _optional(e, "d_bias", d_bias, F32, (k, 1, g)),
        ]
        self._bwd_seq(k, t, b, h, n_in, *args)

    # ------------------------------------------------------------------ output layer
    def argmax(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        """``logits_argmax``: rows (M, V) -> out (M,) int64."""
        e = "logits_argmax"
        m, v = _shape(e, "rows", rows, 2)
        self._argmax(m, v, _tensor(e, "rows", rows, F32, (m, v)), _tensor(e, "out", out, I64, (m,)))

    def ce(self, logits: torch.Tensor, target: torch.Tensor, ignore: int, ce: torch.Tensor,
           hit: torch.Tensor | None) -> None:
        """``logits_ce``: logits (M, V), target (M,) int64 -> ce (M,), hit (M,) bool or None."""
        e = "logits_ce"
        m, v = _shape(e, "logits", logits, 2)
        pt = _tensor(e, "target", target, I64, (m,))
        _in_range(e, "target", target, v, ignore)
        self._ce(m, v, _tensor(e, "logits", logits, F32, (m, v)), pt, ignore,
                 _tensor(e, "ce", ce, F32, (m,)), _optional(e, "hit", hit, BOOL, (m,)))

    def softmax_ce(self, logits: torch.Tensor, target: torch.Tensor, ignore: int,
                   ce: torch.Tensor, e_out: torch.Tensor, inv: torch.Tensor) -> None:
        """``logits_softmax_ce``: logits (M, V), target (M,) -> ce (M,), the softmax numerators
        e_out (M, V) and inv (M,)."""
        e = "logits_softmax_ce"
        m, v = _shape(e, "logits", logits, 2)
        pt = _tensor(e, "target", target, I64, (m,))
        _in_range(e, "target", target, v, ignore)
        self._softmax_ce(m, v, _tensor(e, "logits", logits, F32, (m, v)), pt, ignore,
                         _tensor(e, "ce", ce, F32, (m,)), _tensor(e, "e", e_out, F32, (m, v)),
                         _tensor(e, "inv", inv, F32, (m,)))

    def ce_grad(self, e_in: torch.Tensor, inv: torch.Tensor, target: torch.Tensor, ignore: int,
                grad: torch.Tensor, d: torch.Tensor) -> None:
        """``logits_ce_grad``: e_in (M, V), inv (M,), target (M,), grad (M,) -> d (M, V)
        (d may be e_in)."""
        e = "logits_ce_grad"
        m, v = _shape(e, "e", e_in, 2)
        pt = _tensor(e, "target", target, I64, (m,))
        _in_range(e, "target", target, v, ignore)
        self._ce_grad(m, v, _tensor(e, "e", e_in, F32, (m, v)), _tensor(e, "inv", inv, F32, (m,)),
                      pt, ignore, _tensor(e, "grad", grad, F32, (m,)), _tensor(e, "d", d, F32, (m, v)))

    def out_fwd(self, u: torch.Tensor, w_pad: torch.Tensor, b_pad: torch.Tensor, v: int,
                target: torch.Tensor, ignore: int, ce: torch.Tensor, e_out: torch.Tensor,
                inv: torch.Tensor) -> None:
        """``out_fwd``: u (K, N, D), w_pad (K, D, Vp), b_pad (K, Vp) (V <= Vp real columns),
        target (K, N) -> ce (K, N), e_out (K, N, V), inv (K, N). Raises MemoryError where
        its scratch cannot be allocated."""
        e = "out_fwd"
        k, n, d = _shape(e, "u", u, 3)
        vp = _shape(e, "w_pad", w_pad, 3)[2]
        if not 0 < v <= vp:
            raise KernelCallError(f"{e}: {v} classes in {vp} padded columns. Fix: pad w to at least V columns (padded_output_layer)")
        pt = _tensor(e, "target", target, I64, (k, n))
        _in_range(e, "target", target, v, ignore)
        failed = self._out_fwd(
            k, n, d, v, vp, _tensor(e, "u", u, F32, (k, n, d)), _tensor(e, "w_pad", w_pad, F32, (k, d, vp)),
            _tensor(e, "b_pad", b_pad, F32, (k, vp)), pt, ignore, _tensor(e, "ce", ce, F32, (k, n)),
            _tensor(e, "e", e_out, F32, (k, n, v)), _tensor(e, "inv", inv, F32, (k, n)),
        )
        if failed:
            raise MemoryError(f"the output layer's kernel could not allocate {vp} x 16 floats")

    def out_bwd(self, u: torch.Tensor, w_t: torch.Tensor, target: torch.Tensor, ignore: int,
                grad: torch.Tensor, e_in: torch.Tensor, inv: torch.Tensor, du: torch.Tensor,
                dw_t: torch.Tensor, db: torch.Tensor) -> None:
        """``out_bwd``: u (K, N, D), w_t (K, V, D), target, grad, inv (K, N), e_in (K, N, V)
        (turned into the logits' gradient in place) -> du (K, N, D); dw_t (K, V, D) and db
        (K, 1, V) are accumulated into (pass zeros)."""
        e = "out_bwd"
        k, n, d = _shape(e, "u", u, 3)
        v = _shape(e, "w_t", w_t, 3)[1]
        pt = _tensor(e, "target", target, I64, (k, n))
        _in_range(e, "target", target, v, ignore)
        self._out_bwd(
            k, n, d, v, _tensor(e, "u", u, F32, (k, n, d)), _tensor(e, "w_t", w_t, F32, (k, v, d)),
            pt, ignore, _tensor(e, "grad", grad, F32, (k, n)), _tensor(e, "e", e_in, F32, (k, n, v)),
            _tensor(e, "inv", inv, F32, (k, n)), _tensor(e, "du", du, F32, (k, n, d)),
            _tensor(e, "dw_t", dw_t, F32, (k, v, d)), _tensor(e, "db", db, F32, (k, 1, v)),
        )

    # ------------------------------------------------------------------ decoding
    def attend_one(self, keys_t: torch.Tensor, q: torch.Tensor, bias: torch.Tensor,
                   enc: torch.Tensor, ctx: torch.Tensor) -> None:
        """``attend_one``: keys_t (R, D, Sp), q (R, D), bias (R, Sp), enc (R, S, E) with
        S <= Sp -> ctx (R, E)."""
        e = "attend_one"
        r, d, sp = _shape(e, "keys_t", keys_t, 3)
        s, n_e = _shape(e, "enc", enc, 3)[1:]
        if not 0 < s <= sp:
            raise KernelCallError(f"{e}: {s} source positions in {sp} padded key columns. Fix: pad keys_t and bias to Sp >= S >= 1")
        self._attend_one(
            r, s, sp, d, n_e, _tensor(e, "keys_t", keys_t, F32, (r, d, sp)), _tensor(e, "q", q, F32, (r, d)),
            _tensor(e, "bias", bias, F32, (r, sp)), _tensor(e, "enc", enc, F32, (r, s, n_e)),
            _tensor(e, "ctx", ctx, F32, (r, n_e)),
        )

    def decode(self, *, steps: torch.Tensor, tokens: torch.Tensor, bos: int, table: torch.Tensor,
               vocab: int, w_ih_t: torch.Tensor | None, bias: torch.Tensor | None,
               w_hh_t: torch.Tensor, h0: torch.Tensor, c20: torch.Tensor,
               keys_t: torch.Tensor | None, mask: torch.Tensor | None, enc: torch.Tensor | None,
               comb_ctx_t: torch.Tensor | None, comb_h_t: torch.Tensor | None,
               out_t: torch.Tensor, out_b: torch.Tensor, classes: int,
               glen: torch.Tensor | None = None, gold_in: torch.Tensor | None = None,
               gold_out: torch.Tensor | None = None, ce: torch.Tensor | None = None,
               hit: torch.Tensor | None = None) -> None:
        """``decode_batch`` (see ``kernels/decode.c``): steps (K, N) int32 -> tokens (K, N, T)
        int64; table (K * vocab, 4Hd); w_ih_t (L - 1, K, Hd, 4Hd) and bias (L - 1, K, 4Hd)
        (None when L = 1); w_hh_t (L, K, Hd, 4Hd); h0, c20 (L, K, N, Hd); attention
        (keys_t (K * N, Hd, Sp), mask (K * N, Sp), enc (K * N, S, He), comb_ctx_t (K, He,
        Hd), comb_h_t (K, Hd, Hd)) all or none; out_t (K, Hd, Vp), out_b (K, Vp) with
        ``classes`` <= Vp real columns; teacher forcing (glen (K, N) int32, gold_in,
        gold_out (K, N, Tg) int64 -> ce (K, N, Tg), hit (K, N, Tg) bool) all or none.
        Raises MemoryError where its buffers cannot be allocated."""
        e = "decode_batch"
        k, n = _shape(e, "steps", steps, 2)
        t = _shape(e, "tokens", tokens, 3)[2]
        layers, _, _, hd = _shape(e, "h0", h0, 4)
        g = 4 * hd
        vp = _shape(e, "out_t", out_t, 3)[2]
        if not 0 < classes <= vp or not 0 <= bos < vocab:
            raise KernelCallError(f"{e}: {classes} classes in {vp} columns, BOS {bos} of {vocab} tokens. Fix: pad out_t to V columns and pass a BOS below the vocabulary size")
        if (w_ih_t is None) != (layers == 1) or (bias is None) != (layers == 1):
            raise KernelCallError(f"{e}: w_ih_t and bias are for layers 1 .. L - 1: None exactly when L = 1 (L = {layers}). Fix: pass them so")
        attn = (keys_t, mask, enc, comb_ctx_t, comb_h_t)
        if any(a is None for a in attn) != all(a is None for a in attn):
            raise KernelCallError(f"{e}: the attention tensors (keys_t, mask, enc, comb_ctx_t, comb_h_t) come all or none. Fix: pass all five, or none for a model without attention")
        forced = (glen, gold_in, gold_out, ce, hit)
        if any(a is None for a in forced) != all(a is None for a in forced):
            raise KernelCallError(f"{e}: the teacher-forcing tensors (glen, gold_in, gold_out, ce, hit) come all or none. Fix: pass all five, or none")
        s = sp = he = tg = 0
        if keys_t is not None and enc is not None:
            sp = _shape(e, "keys_t", keys_t, 3)[2]
            s, he = _shape(e, "enc", enc, 3)[1:]
            if not 0 < s <= sp:
                raise KernelCallError(f"{e}: {s} source positions in {sp} padded key columns. Fix: pad keys_t and mask to Sp >= S >= 1")
        ps = _tensor(e, "steps", steps, I32, (k, n))
        _in_range(e, "steps", steps, t + 1)
        if glen is not None and gold_in is not None and gold_out is not None:
            tg = _shape(e, "gold_in", gold_in, 3)[2]
            _tensor(e, "glen", glen, I32, (k, n))
            _in_range(e, "glen", glen, tg + 1)
            _tensor(e, "gold_in", gold_in, I64, (k, n, tg))
            _tensor(e, "gold_out", gold_out, I64, (k, n, tg))
            gold = torch.arange(tg) < glen.unsqueeze(-1)  # the positions the kernel reads
            _in_range(e, "gold_in", gold_in, vocab, where=gold)
            _in_range(e, "gold_out", gold_out, classes, where=gold)
        args = [
            ps, _optional(e, "glen", glen, I32, (k, n)), _optional(e, "gold_in", gold_in, I64, (k, n, tg)),
            _optional(e, "gold_out", gold_out, I64, (k, n, tg)), _tensor(e, "table", table, F32, (k * vocab, g)),
            _optional(e, "w_ih_t", w_ih_t, F32, (layers - 1, k, hd, g)),
            _optional(e, "bias", bias, F32, (layers - 1, k, g)),
            _tensor(e, "w_hh_t", w_hh_t, F32, (layers, k, hd, g)),
            _tensor(e, "h0", h0, F32, (layers, k, n, hd)), _tensor(e, "c20", c20, F32, (layers, k, n, hd)),
            _optional(e, "keys_t", keys_t, F32, (k * n, hd, sp)), _optional(e, "mask", mask, F32, (k * n, sp)),
            _optional(e, "enc", enc, F32, (k * n, s, he)), _optional(e, "comb_ctx_t", comb_ctx_t, F32, (k, he, hd)),
            _optional(e, "comb_h_t", comb_h_t, F32, (k, hd, hd)), _tensor(e, "out_t", out_t, F32, (k, hd, vp)),
            _tensor(e, "out_b", out_b, F32, (k, vp)), _optional(e, "ce", ce, F32, (k, n, tg)),
            _optional(e, "hit", hit, BOOL, (k, n, tg)), _tensor(e, "tokens", tokens, I64, (k, n, t)),
        ]
        if self._decode(k, n, layers, hd, he, s, sp, classes, vp, vocab, t, tg, bos, *args):
            raise MemoryError("the C decoder could not allocate its buffers")


def _shape(entry: str, name: str, x: Any, dims: int) -> tuple[int, ...]:
    """``x``'s shape, checked to have ``dims`` dimensions (the sizes the others must fit)."""
    if not isinstance(x, torch.Tensor) or x.dim() != dims:
        got = _describe(x) if isinstance(x, torch.Tensor) else type(x).__name__
        raise KernelCallError(
            f"{entry}: {name} must be a {dims}-d tensor, got {got}. Fix: pass the layout the "
            "kernel's header documents"
        )
    return tuple(int(s) for s in x.shape)
