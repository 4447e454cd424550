"""A hand-written, bundled LSTM layer with a manual backward pass.

Shapes: K members, T time steps, B examples, H hidden units, G = 4H gate units. Buffers
are member-major ``(K, T, B, .)``: step t is ``[:, t]``, K contiguous ``(B, .)`` blocks,
and the input projection (one ``bmm`` for all steps), ``dW_hh`` and the gradient of the
input projection need no transposes.

Gates are kept in the internal order **o, i, f, g** (torch: i, f, g, o; rows permuted by
:func:`prepare_gates`): the three gates whose gradient scales with ``dc`` are adjacent.

**Two implementations of a layer.** On a CPU (float32) a training layer is ONE call of
compiled C (:mod:`ckernels`, ``kernels/lstm_seq.c``) forward and one backward: every time
step's input projection, recurrent matmul and cell update, member by member with the
member's ``W_ih`` and ``W_hh`` in cache, the bias added there too (``baddbmm`` with a
broadcast bias first copies it over the whole (K, T*B, 4H) output), and backward the
inputs' gradient; then ``dW_ih`` and ``dW_hh`` are one ``bmm`` each. No (K, T, B, 4H)
projection is written and read back, and padding rows are never projected. With
``active``, step t computes only the first ``active[t]`` rows of each member (training batches list the
longest sequences first, so rows whose sequence has ended are a suffix; their outputs stay
0 and get no gradient). Elsewhere (CUDA, float64, or no C compiler) the step is the torch
ops below, over all rows. The two agree to float rounding (~1e-7 relative; tested).
Measured on one CPU thread at K=8, B=64, T=31, H=32 (decoder, forward + backward): torch
ops 19.8 ms, a compiled cell per step 12.4 ms, skipping ended rows 10.6 ms (Intel Xeon);
on an AMD EPYC with ~91% of the rows live, a ``baddbmm`` and a cell call per step 11.5 ms,
the whole layer in C 10.7 ms, and two K=8 training processes side by side (as Ray runs
them) trained 5.4% more seed-samples/s (four alternating pairs of 100 steps each); with
the input projection moved into the kernel too, the decoder layer with its projection,
forward and backward, took 16.2 ms instead of 17.3 ms (medians of 15 interleaved rounds).

**Why a custom autograd.Function.** Autograd over a Python time loop records about ten
nodes per step, and writing outputs into a preallocated buffer under autograd adds a
``CopySlices`` node per step whose backward clones the whole buffer (quadratic in T).
Here the forward writes each step into preallocated buffers with ``out=`` ops (no
autograd inside), and the backward is one reverse loop of six small ops per step. The
gate derivatives that do not depend on the recurrence are computed vectorised over
chunks of steps sized to stay in cache (vectorising over all T at once streams
``(K, T, B, 4H)`` arrays through memory, which is slower for large K).

Measured on one CPU thread (see ``benchmarks/seq2seq_kernels.py``): torch's ``tanh``
costs about six ``sigmoid``s per element; computing it as ``2 sigmoid(2x) - 1`` saved
about 5% of a K=1 training step but moved gradients about 1e-7 relative away from the
reference's rounding (several times that on the ill-conditioned attention weights), so
the training cell uses ``tanh`` like ``nn.LSTM`` does. Evaluation has no gradients to keep
close to the reference's, so :func:`lstm_sequence_eval` does use sigmoids (its outputs are
within ~1e-6 of the training cell's).

**torch.compile does not pay here** (one CPU thread, H=32, B=64), so there is no
compiled path: compiling one step costs ~30 us per call, more than the eager ops it
fuses; compiling a whole unrolled sequence made the recurrence ~2x faster than a naive
eager loop but costs ~170 s of compilation per distinct T; compiling fixed 8-step chunks
(one 60-80 s compile per (K, B, H), T padded) ran full training steps 10-16% *slower*
than this eager cell (K=1 and K=4, interleaved A/B), and its guards (input aliasing,
``requires_grad``) recompiled into dynamo's limit of 8.
"""

from __future__ import annotations

from typing import Any

import torch

from trainables.models.ckernels import CpuKernels, KernelChoice, applicable

CHUNK_FLOATS = 65536
"""Backward gate derivatives are computed for chunks of about this many gate values."""


def gate_order(hidden: int, device: torch.device | str) -> torch.Tensor:
    """Row permutation from torch's gate order (i, f, g, o) to ours (o, i, f, g)."""
    # 3H..4H-1, 0..3H-1, made on the device (a host tensor copied there costs a copy per
    # call and cannot be captured in a CUDA graph)
    return torch.arange(4 * hidden, device=device).roll(hidden)


def prepare_gates(w: torch.Tensor, hidden: int) -> torch.Tensor:
    """Torch-layout gate rows (K, 4H, ...) -> our gate order (differentiable)."""
    return w.index_select(1, gate_order(hidden, w.device))


class LSTMSequence(torch.autograd.Function):
    """One bundled LSTM layer over T steps: (x, w_ih, w_hh, h0, c0, active, bias, kern) -> (hs, cs).

    x (K, T, B, E) the layer's inputs; w_ih (K, 4H, E) and w_hh (K, 4H, H) in our gate
    order (:func:`prepare_gates`); bias (K, 1, 4H) both biases summed, or None; h0, c0
    (K, B, H). Returns every step's hidden and cell state (K, T, B, H) (cs so callers can
    take each sequence's own last cell state). ``active`` (T ints; None or empty: all
    rows): rows each step must compute, a prefix; the compiled path skips the rest (see
    the module doc), the torch-ops path computes all. ``kern``: the model's kernels (None:
    torch ops; :func:`~trainables.models.ckernels.applicable`). Per-step views are made once with
    ``unbind`` (slicing inside the loop costs as much as the arithmetic at these sizes).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        w_ih: torch.Tensor,
        w_hh: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor,
        active: tuple[int, ...] | None = None,
        bias: torch.Tensor | None = None,
        kern: KernelChoice = "default",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fused = applicable(kern, x, w_hh.shape[-1])
        ctx.active = active
        ctx.has_bias = bias is not None
        if fused is not None:
            return _fused_forward(ctx, fused, x, w_ih, w_hh, h0, c0, active, bias)
        ctx.fused = None
        k, t_len, b, e = x.shape
        xp = torch.bmm(x.reshape(k, t_len * b, e), w_ih.transpose(1, 2)).view(k, t_len, b, -1)
        if bias is not None:
            xp += bias.unsqueeze(1)
        g4 = xp.shape[-1]
        hid = g4 // 4
        w_hh_t = w_hh.transpose(1, 2)  # (K, H, 4H)
        act = xp.new_empty(k, t_len, b, g4)  # gate activations o, i, f, g
        hs = xp.new_empty(k, t_len, b, hid)
        cs = torch.empty_like(hs)
        tcs = torch.empty_like(hs)  # tanh(c)
        z = xp.new_empty(k, b, g4)
        z_g = z[..., 3 * hid :]
        gates = act.view(k, t_len, b, 4, hid)
        o, i, f, g = (gates[..., n, :].unbind(1) for n in range(4))
        xps, acts, hss, css, tcss = (x.unbind(1) for x in (xp, act, hs, cs, tcs))
        h, c = h0, c0
        for t in range(t_len):
            torch.baddbmm(xps[t], h, w_hh_t, out=z)
            torch.sigmoid(z, out=acts[t])  # the g part is overwritten next
            torch.tanh(z_g, out=g[t])
            torch.mul(f[t], c, out=css[t]).addcmul_(i[t], g[t])
            torch.tanh(css[t], out=tcss[t])
            torch.mul(o[t], tcss[t], out=hss[t])
            h, c = hss[t], css[t]
        ctx.save_for_backward(x, act, hs, cs, tcs, h0, c0, w_ih, w_hh)
        ctx.set_materialize_grads(False)
        return hs, cs

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, dhs: torch.Tensor | None, dcs: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        if ctx.fused is not None:
            return _fused_backward(ctx, dhs, dcs)
        x, act, hs, cs, tcs, h0, c0, w_ih, w_hh = ctx.saved_tensors
        k, t_len, b, g4 = act.shape
        hid = g4 // 4
        d_gates = torch.empty_like(act)  # (K, T, B, 4H)
        d_all = d_gates.view(k, t_len, b, 4, hid).unbind(1)
        d_o = d_gates[..., :hid].unbind(1)
        dhs_t = dhs.unbind(1) if dhs is not None else None
        dcs_t = dcs.unbind(1) if dcs is not None else None
        dh = hs.new_zeros(k, b, hid)
        dc = hs.new_zeros(k, b, hid)
        # CPU: cache-sized chunks; CUDA: all steps at once (each op is a kernel launch there)
        chunk = t_len if act.is_cuda else max(1, CHUNK_FLOATS // (k * b * g4))
        for t1 in range(t_len, 0, -chunk):
            t0 = max(0, t1 - chunk)
            coef_h, coef, f = _gate_derivatives(act, cs, tcs, c0, t0, t1)
            coef_h_t, f_t = coef_h.unbind(1), f.unbind(1)
            coef_all = coef.view(k, t1 - t0, b, 4, hid).unbind(1)
            coef_o = coef[..., :hid].unbind(1)
            for t in range(t1 - 1, t0 - 1, -1):
                j = t - t0
                if dhs_t is not None:
                    dh.add_(dhs_t[t])
                if dcs_t is not None:
                    dc.add_(dcs_t[t])
                dc.addcmul_(dh, coef_h_t[j])  # dc += dh o (1 - tanh(c)^2)
                torch.mul(dc.unsqueeze(2), coef_all[j], out=d_all[t])  # i, f, g scale with dc
                torch.mul(dh, coef_o[j], out=d_o[t])  # o scales with dh
                dc.mul_(f_t[j])
                dh = torch.bmm(d_gates[:, t], w_hh)
        d_flat = d_gates.view(k, t_len * b, g4)
        dx = torch.bmm(d_flat, w_ih).view(x.shape)
        d_bias = d_flat.sum(1, keepdim=True) if ctx.has_bias else None
        return dx, _d_weight(d_gates, x), _d_w_hh(d_gates, hs, h0), dh, dc, None, d_bias, None


def _d_weight(d_gates: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """The gradient (K, 4H, F) of a weight applied to ``inputs`` (K, T, B, F): the sum over
    steps and rows of d_gates_t inputs_t^T, one ``bmm`` (time-major: a member's padding
    steps are trailing exact zeros in its reduction, as in a lone run)."""
    k, t_len, b, g4 = d_gates.shape
    return torch.bmm(
        d_gates.view(k, t_len * b, g4).transpose(1, 2), inputs.reshape(k, t_len * b, -1)
    )


def _d_w_hh(d_gates: torch.Tensor, hs: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """dW_hh (K, 4H, H): :func:`_d_weight` over the states each step started from."""
    return _d_weight(d_gates, torch.cat([h0.unsqueeze(1), hs[:, :-1]], 1))


def _fused_forward(
    ctx: Any,
    kern: CpuKernels,
    x: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    active: tuple[int, ...] | None,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`LSTMSequence`'s forward as one call of the compiled layer
    (``kernels/lstm_seq.c``: the input projection, the recurrent matmul and the cell of
    every step), over the first ``active[t]`` rows of each member only. Rows past that
    stay 0 in every output (their sequences have ended)."""
    k, t_len, b, _ = x.shape
    hid = w_hh.shape[-1]
    g4 = 4 * hid
    x, h0, c0 = x.contiguous(), h0.contiguous(), c0.contiguous()
    w_ih_t = w_ih.transpose(1, 2).contiguous()  # (K, E, 4H)
    w_hh_t = w_hh.transpose(1, 2).contiguous()  # (K, H, 4H)
    b_c = bias.contiguous() if bias is not None else None
    act = x.new_empty(k, t_len, b, g4)  # gate activations o, i, f, g (of live rows)
    hs = x.new_empty(k, t_len, b, hid)  # the kernel writes 0 past the live rows
    cs, tcs = torch.empty_like(hs), torch.empty_like(hs)  # cell states, tanh(c) (live rows)
    kern.fwd_seq(x, w_ih_t, b_c, w_hh_t, h0, c0, active, act, cs, tcs, hs)
    ctx.fused = kern
    ctx.save_for_backward(x, act, hs, cs, tcs, h0, c0, w_ih, w_hh)
    ctx.set_materialize_grads(False)
    return hs, cs


def _fused_backward(
    ctx: Any, dhs: torch.Tensor | None, dcs: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    """The backward of :func:`_fused_forward`: one call of the compiled layer's backward
    (per step the gate gradients, the input gradient through ``W_ih``, dh through ``W_hh``,
    and the gradients of ``W_ih``, ``W_hh`` and the bias, accumulated as the steps go: at the
    paper's sizes 3x faster than a ``bmm`` each over all steps afterwards)."""
    kern: CpuKernels = ctx.fused
    x, act, hs, cs, tcs, h0, c0, w_ih, w_hh = ctx.saved_tensors
    k, _, b, g4 = act.shape
    hid = g4 // 4
    w_ih_c, w_hh_c = w_ih.contiguous(), w_hh.contiguous()
    dhs_c = dhs.contiguous() if dhs is not None else None
    dcs_c = dcs.contiguous() if dcs is not None else None
    d_gates = torch.empty_like(act)  # (K, T, B, 4H); the kernel writes 0 past the live rows
    dx = torch.empty_like(x)
    dh, dc = hs.new_empty(k, b, hid), hs.new_empty(k, b, hid)
    d_bias = act.new_empty(k, 1, g4) if ctx.has_bias else None
    dw_ih, dw_hh = torch.empty_like(w_ih_c), torch.empty_like(w_hh_c)
    kern.bwd_seq(x, h0, hs, w_ih_c, w_hh_c, dhs_c, dcs_c, act, cs, tcs, c0, ctx.active,
                 d_gates, dx, dh, dc, dw_ih, dw_hh, d_bias)
    return dx, dw_ih, dw_hh, dh, dc, None, d_bias, None


def _gate_derivatives(
    act: torch.Tensor, cs: torch.Tensor, tcs: torch.Tensor, c0: torch.Tensor, t0: int, t1: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For steps t0..t1-1 (C of them): coef_h (K, C, B, H) = o (1 - tanh(c)^2); coef
    (K, C, B, 4H) = d gate pre-activation / d(h for o, c for i, f, g); f (K, C, B, H)."""
    hid = cs.shape[-1]
    a = act[:, t0:t1]
    o, i, f, g = a[..., :hid], a[..., hid : 2 * hid], a[..., 2 * hid : 3 * hid], a[..., 3 * hid :]
    tc = tcs[:, t0:t1]
    c_prev = cs[:, t0 - 1 : t1 - 1] if t0 > 0 else torch.cat([c0.unsqueeze(1), cs[:, : t1 - 1]], 1)
    coef = torch.empty_like(a)
    torch.mul(tc * o, 1.0 - o, out=coef[..., :hid])
    torch.mul(g * i, 1.0 - i, out=coef[..., hid : 2 * hid])
    torch.mul(c_prev * f, 1.0 - f, out=coef[..., 2 * hid : 3 * hid])
    torch.mul(i, 1.0 - g * g, out=coef[..., 3 * hid :])
    coef_h = o * (1.0 - tc * tc)
    return coef_h, coef, f.contiguous()


def double_g(w: torch.Tensor, hidden: int, dim: int = -1) -> torch.Tensor:
    """``w`` with the g block (entries ``3H:4H`` of dimension ``dim``, our gate order)
    multiplied by 2. Exact in floating point, so a g pre-activation computed from it comes
    out doubled bit for bit (what :func:`lstm_sequence_eval` wants)."""
    shape = [1] * w.dim()
    shape[dim] = 4 * hidden
    scale = torch.ones(4 * hidden, dtype=w.dtype, device=w.device)
    scale[3 * hidden :] = 2.0
    return w * scale.view(shape)


def cell_step_eval(
    z2: torch.Tensor,
    c2: torch.Tensor,
    s: torch.Tensor,
    c2_out: torch.Tensor,
    tc: torch.Tensor,
    h_out: torch.Tensor,
    kern: KernelChoice = "default",
) -> None:
    """One LSTM update without ``tanh`` (see :func:`lstm_sequence_eval`): pre-activations z2
    (K, B, 4H) with the g block doubled and the doubled cell c2 (K, B, H), written into ``s``
    (scratch, gate sigmoids), ``c2_out`` (the new doubled cell), ``tc`` (scratch) and
    ``h_out``. With the kernels (``kern``) on a CPU, where each tensor is K contiguous (B, .)
    blocks, one call of the compiled C step (``s`` and ``tc`` unused)."""
    hid = c2.shape[-1]
    fused = applicable(kern, z2, hid)
    blocks = _member_blocks(z2, c2, c2_out, h_out) and c2_out.stride(0) == h_out.stride(0)
    if fused is not None and blocks:
        fused.eval_step(z2, c2, c2_out, h_out)
        return
    o, i, f, g = s[..., :hid], s[..., hid : 2 * hid], s[..., 2 * hid : 3 * hid], s[..., 3 * hid :]
    torch.sigmoid(z2, out=s)  # g block: sigmoid(2 x_g), so tanh(x_g) = 2 g - 1
    torch.mul(f, c2, out=c2_out).addcmul_(i, g, value=4.0).sub_(i, alpha=2.0)
    torch.sigmoid(c2_out, out=tc).mul_(2.0).sub_(1.0)  # tanh(c)
    torch.mul(o, tc, out=h_out)


def _member_blocks(*xs: torch.Tensor) -> bool:
    """Whether each (K, B, F) tensor is K contiguous (B, F) blocks (any member stride)."""
    return all(x.stride(2) == 1 and x.stride(1) == x.shape[2] for x in xs)


@torch.no_grad()
def lstm_sequence_eval(
    xp2: torch.Tensor,
    w_hh2: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    kern: KernelChoice = "default",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LSTM layer without gradients, with ``tanh(x) = 2 sigmoid(2x) - 1``: one sigmoid
    over all four gates and one over the cell, no ``tanh`` (which costs about five sigmoids
    per element on a CPU core, more on the strided g block). 1.8x the training cell's
    forward at K=8, B=256.

    xp2 (K, T, B, 4H) input projections (biases included) and w_hh2 (K, 4H, H) in our
    gate order (:func:`prepare_gates`) but with the g block doubled (:func:`double_g`), so
    ``sigmoid`` of it is ``sigmoid(2 x_g)``; the cell is kept doubled too (``c2 = 2c``:
    ``c2' = f c2 + 4 i sigmoid(2 x_g) - 2 i``, ``tanh(c) = 2 sigmoid(c2) - 1``). Returns hs, cs (K, T, B, H)
    like the training cell, to ~1e-6. A step is one ``baddbmm`` and :func:`cell_step_eval`
    (on a CPU one call of the compiled ``lstm_eval_step``). Unlike training's, this layer
    as one C call (with the matmul of ``kernels/lstm_seq.c``) was slower: at evaluation's
    256 rows per member MKL's ``baddbmm`` is the faster matmul (K=8, T=31, B=256: 15.5 ms
    per layer as one C call, 14.3 ms this way; AMD EPYC).
    """
    k, t_len, b, g4 = xp2.shape
    hs = xp2.new_empty(k, t_len, b, g4 // 4)
    cs2 = torch.empty_like(hs)
    c2 = c0 * 2.0
    w_t = w_hh2.transpose(1, 2)  # (K, H, 4H)
    z, s, tc = xp2.new_empty(k, b, g4), xp2.new_empty(k, b, g4), torch.empty_like(h0)
    xps, hss, css = xp2.unbind(1), hs.unbind(1), cs2.unbind(1)
    h = h0
    for t in range(t_len):
        cell_step_eval(torch.baddbmm(xps[t], h, w_t, out=z), c2, s, css[t], tc, hss[t], kern)
        h, c2 = hss[t], css[t]
    return hs, cs2.mul_(0.5)


def lstm_sequence(
    x: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    active: tuple[int, ...] | None = None,
    bias: torch.Tensor | None = None,
    kern: KernelChoice = "default",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Typed wrapper of :class:`LSTMSequence` (see there for shapes, ``active``, ``bias`` and
    ``kern``)."""
    out = LSTMSequence.apply(x, w_ih, w_hh, h0, c0, active, bias, kern)
    return out[0], out[1]
