"""Hand-written recurrent cells over stacked parameters, with hand-derived backward passes.

Shapes: ``K`` members, ``B`` sequences, ``T`` steps, ``H`` hidden units, ``G`` gates per
unit (LSTM 4, GRU 3, ReLU RNN 1), ``I`` input symbols, ``O`` outputs. Parameters follow
PyTorch's layout and gate order (LSTM ``i, f, g, o``; GRU ``r, z, n``) with a leading
member dimension: ``w_ih (K, GH, I)``, ``w_hh (K, GH, H)``, ``b_ih (K, GH)``,
``b_hh (K, GH)``, ``w_out (K, O, H)``, ``b_out (K, O)``.

The input is one-hot, so ``xw = W_ih x + bias`` is a row lookup (:func:`embed`). Per step a
cell turns ``xw_t`` and ``h`` into the next ``h`` (:meth:`Cell.step`; differentiable by
autograd). The manual backward (:meth:`Cell.backward`) is built for speed at batch size 1,
where every op is overhead: everything that does not depend on the incoming gradient is
computed for all steps at once, and the sequential scan back through time keeps only the
few ops that carry the gradient from step to step.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

State = tuple[Tensor, ...]
"""Recurrent state beyond ``h``: LSTM ``(c,)``, others ``()``."""


class Params(NamedTuple):
    """Stacked parameters of a bundle (see module docstring for shapes)."""

    w_ih: Tensor
    w_hh: Tensor
    b_ih: Tensor
    b_hh: Tensor
    w_out: Tensor
    b_out: Tensor


PARAM_NAMES: tuple[str, ...] = Params._fields


def matvec_add(bias: Tensor, h: Tensor, w_t: Tensor) -> Tensor:
    """``bias + h @ w_t`` for ``h (K, B, H)``, ``w_t (K, H, GH)``; elementwise when H = 1
    (one op in eager mode, and fusable with the gates under torch.compile)."""
    if h.shape[-1] == 1:
        return torch.addcmul(bias, h, w_t)
    return torch.baddbmm(bias, h, w_t)


def small_bmm(a: Tensor, b: Tensor) -> Tensor:
    """``torch.bmm(a, b)`` for tiny matrices; while compiling, a broadcast product and sum
    that inductor fuses into its loops (an extern BLAS call per tiny product costs more)."""
    if torch.compiler.is_compiling():
        return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)
    return torch.bmm(a, b)


def _shift(seq: Tensor) -> Tensor:
    """``seq (K, B, T, ...)`` delayed one step along T, a zero first: the previous values."""
    return torch.cat([torch.zeros_like(seq[:, :, :1]), seq[:, :, :-1]], dim=2)


def rowmat(a: Tensor, m: Tensor) -> Tensor:
    """``a @ m`` per member: ``a (K, ..., H)``, ``m (K, H, N)`` -> ``(K, ..., N)``."""
    k, n = a.shape[0], a.shape[-1]
    return small_bmm(a.reshape(k, -1, n), m).view(*a.shape[:-1], m.shape[-1])


def vecmat(d: Tensor, m: Tensor) -> Tensor:
    """``d @ m`` per element: ``d (K, B, H)``, ``m (K, B, H, H)`` -> ``(K, B, H)``; a product when H = 1."""
    if d.shape[-1] == 1:
        return d * m[..., 0]
    return (d.unsqueeze(-2) @ m).squeeze(-2)


def adjoint_scan(dhs: Tensor, transfer: Tensor) -> Tensor:
    """``dh (K, B, T, H)``: the total loss gradient reaching each ``h_t``, from the readout's
    ``dhs`` and ``dh_{t-1} = dh_t @ transfer_t`` (``transfer (K, B, T, H, H)``)."""
    dhs_t, m_t = dhs.unbind(2), transfer.unbind(2)
    dh = torch.zeros_like(dhs_t[0])
    out: list[Tensor] = []
    for t in range(len(dhs_t) - 1, -1, -1):
        dh = dhs_t[t] + dh
        out.append(dh)
        dh = vecmat(dh, m_t[t])
    return torch.stack(out[::-1], dim=2)


def _gates(w_hh: Tensor, gates: int) -> Tensor:
    """``W_hh (K, GH, H)`` as ``(K, 1, 1, G, H, H)``: [gate, unit, input unit]."""
    k, _, n_h = w_hh.shape
    return w_hh.view(k, 1, 1, gates, n_h, n_h)


class Cell:
    """One recurrent cell: a forward step and the backward pass over a whole sequence.

    The backward pass works on the adjoint recurrence: the gradient reaching ``h_{t-1}``
    through the cell is a linear map of the gradient reaching step ``t`` whose
    coefficients depend only on the forward values, so they are computed for all steps
    at once and the sequential part is a tiny linear scan (:func:`adjoint_scan`).
    """

    gates: ClassVar[int]
    torch_module: ClassVar[str]
    """Name of the matching ``torch.nn`` module (the reference implementation)."""

    @staticmethod
    def input_bias(p: Params) -> Tensor:
        """The bias folded into ``xw`` ``(K, GH)``."""
        return p.b_ih + p.b_hh

    @staticmethod
    def zero_state(h: Tensor) -> State:
        return ()

    @staticmethod
    def step(
        xw: Tensor, h: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor
    ) -> tuple[Tensor, State, State]:
        """``(h_new, state_new, kept)`` from ``xw (K, B, GH)``, ``h (K, B, H)``,
        ``w_hh_t (K, H, GH)`` and ``b_hh (K, 1, GH)``; ``kept`` is what :meth:`backward` reads."""
        raise NotImplementedError

    @staticmethod
    def backward(
        xw: Tensor, hs: Tensor, kept: State, dhs: Tensor, p: Params
    ) -> tuple[Tensor, Tensor]:
        """Gradients of ``xw`` and of ``W_hh h_prev + b_hh``, both ``(K, B, T, GH)``.

        ``xw (K, B, T, GH)``, hidden states ``hs (K, B, T, H)``, ``kept`` (each step's
        ``kept`` stacked on dim 2) and ``dhs (K, B, T, H)``, the loss gradient reaching
        each ``h_t`` from the readout.
        """
        raise NotImplementedError


class LSTMCell(Cell):
    """``c' = f c + i g``, ``h' = o tanh(c')`` (PyTorch's nn.LSTM)."""

    gates = 4
    torch_module = "LSTM"

    @staticmethod
    def zero_state(h: Tensor) -> State:
        return (torch.zeros_like(h),)

    @staticmethod
    def step(
        xw: Tensor, h: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor
    ) -> tuple[Tensor, State, State]:
        n = h.shape[-1]
        pre = matvec_add(xw, h, w_hh_t)  # (K, B, 4H); xw carries both biases
        act = torch.sigmoid(pre)
        g = torch.tanh(pre[..., 2 * n : 3 * n])
        c = torch.addcmul(act[..., n : 2 * n] * state[0], act[..., :n], g)  # f c + i g
        h_new = act[..., 3 * n :] * torch.tanh(c)
        return h_new, (c,), (c,)

    @staticmethod
    def backward(
        xw: Tensor, hs: Tensor, kept: State, dhs: Tensor, p: Params
    ) -> tuple[Tensor, Tensor]:
        (c,) = kept  # (K, B, T, H)
        n = c.shape[-1]
        pre = xw + rowmat(_shift(hs), p.w_hh.transpose(1, 2))  # (K, B, T, 4H)
        act = torch.sigmoid(pre)
        i, f, o = act[..., :n], act[..., n : 2 * n], act[..., 3 * n :]
        g = torch.tanh(pre[..., 2 * n : 3 * n])
        tc = torch.tanh(c)
        zero = torch.zeros_like(c)
        # dpre_t = dc_t * u_t + dh_t * v_t per gate (K, B, T, 4, H), where
        # dc_t = dh_t * o (1 - tanh^2 c) + dc_{t+1} f_{t+1}
        u = torch.stack([g * i * (1 - i), _shift(c) * f * (1 - f), i * (1 - g * g), zero], dim=-2)
        v = torch.stack([zero, zero, zero, tc * o * (1 - o)], dim=-2)
        w = _gates(p.w_hh, 4)
        uw = (u.unsqueeze(-1) * w).sum(-3)  # (K, B, T, H, H): dc_t's share of dh_{t-1}
        vw = (v.unsqueeze(-1) * w).sum(-3)  # dh_t's share
        dc_dh = o * (1 - tc * tc)
        dhs_t, a_t, f_t, uw_t, vw_t = (x.unbind(2) for x in (dhs, dc_dh, f, uw, vw))
        dh_next = torch.zeros_like(dhs_t[0])
        carry = torch.zeros_like(dh_next)  # dc_{t+1} f_{t+1}
        dh_all: list[Tensor] = []
        dc_all: list[Tensor] = []
        for t in range(len(dhs_t) - 1, -1, -1):
            dh = dhs_t[t] + dh_next
            dc = torch.addcmul(carry, dh, a_t[t])
            dh_next = vecmat(dc, uw_t[t]) + vecmat(dh, vw_t[t])
            carry = dc * f_t[t]
            dh_all.append(dh)
            dc_all.append(dc)
        dh_seq = torch.stack(dh_all[::-1], dim=2).unsqueeze(-2)  # (K, B, T, 1, H)
        dc_seq = torch.stack(dc_all[::-1], dim=2).unsqueeze(-2)
        dpre = (dc_seq * u + dh_seq * v).flatten(-2)  # (K, B, T, 4H)
        return dpre, dpre


class GRUCell(Cell):
    """``n = tanh(xw_n + r hw_n)``, ``h' = (1 - z) n + z h`` (PyTorch's nn.GRU)."""

    gates = 3
    torch_module = "GRU"

    @staticmethod
    def input_bias(p: Params) -> Tensor:
        return p.b_ih  # b_hh stays inside hw: r gates its n-part

    @staticmethod
    def step(
        xw: Tensor, h: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor
    ) -> tuple[Tensor, State, State]:
        n_h = h.shape[-1]
        hw = matvec_add(b_hh, h, w_hh_t)  # (K, B, 3H)
        rz = torch.sigmoid(xw[..., : 2 * n_h] + hw[..., : 2 * n_h])
        n = torch.tanh(torch.addcmul(xw[..., 2 * n_h :], rz[..., :n_h], hw[..., 2 * n_h :]))
        h_new = torch.addcmul(n, rz[..., n_h:], h - n)
        return h_new, (), ()

    @staticmethod
    def backward(
        xw: Tensor, hs: Tensor, kept: State, dhs: Tensor, p: Params
    ) -> tuple[Tensor, Tensor]:
        n_h = hs.shape[-1]
        h_prev = _shift(hs)
        hw = p.b_hh[:, None, None] + rowmat(h_prev, p.w_hh.transpose(1, 2))  # (K, B, T, 3H)
        rz = torch.sigmoid(xw[..., : 2 * n_h] + hw[..., : 2 * n_h])
        r, z = rz[..., :n_h], rz[..., n_h:]
        hw_n = hw[..., 2 * n_h :]
        n = torch.tanh(xw[..., 2 * n_h :] + r * hw_n)
        dn = (1 - z) * (1 - n * n)  # gradient of n's pre-activation per unit dh
        dr = dn * hw_n * r * (1 - r)
        dz = (h_prev - n) * z * (1 - z)
        px = torch.stack([dr, dz, dn], dim=-2)  # (K, B, T, 3, H): dxw_t = dh_t * px_t
        ph = torch.stack([dr, dz, dn * r], dim=-2)  # dhw_t = dh_t * ph_t
        transfer = torch.diag_embed(z) + (ph.unsqueeze(-1) * _gates(p.w_hh, 3)).sum(-3)
        dh = adjoint_scan(dhs, transfer).unsqueeze(-2)  # (K, B, T, 1, H)
        return (dh * px).flatten(-2), (dh * ph).flatten(-2)


class ReLUCell(Cell):
    """``h' = relu(xw + hw)`` (PyTorch's nn.RNN with nonlinearity="relu")."""

    gates = 1
    torch_module = "RNN"

    @staticmethod
    def step(
        xw: Tensor, h: Tensor, state: State, w_hh_t: Tensor, b_hh: Tensor
    ) -> tuple[Tensor, State, State]:
        return torch.relu(matvec_add(xw, h, w_hh_t)), (), ()

    @staticmethod
    def backward(
        xw: Tensor, hs: Tensor, kept: State, dhs: Tensor, p: Params
    ) -> tuple[Tensor, Tensor]:
        on = (hs > 0).to(hs.dtype)  # (K, B, T, H): relu'
        transfer = on.unsqueeze(-1) * _gates(p.w_hh, 1)[:, :, :, 0]  # (K, B, T, H, H)
        dpre = adjoint_scan(dhs, transfer) * on
        return dpre, dpre


CELLS: dict[str, type[Cell]] = {"lstm": LSTMCell, "gru": GRUCell, "relu": ReLUCell}


def embed(table: Tensor, x: Tensor) -> Tensor:
    """``xw (K, B, T, GH)``: rows of ``table (K, I, GH)`` for symbol ids ``x (K|1, B, T)``."""
    k, _, gh = table.shape
    if x.shape[0] == 1:  # every member reads the same rows (evaluation)
        return table.index_select(1, x.reshape(-1)).view(k, *x.shape[1:], gh)
    idx = x.reshape(k, -1, 1).expand(-1, -1, gh)  # (K, B*T, GH)
    return torch.gather(table, 1, idx).view(k, *x.shape[1:], gh)


class Trace(NamedTuple):
    """What :func:`run` keeps for :func:`backward`."""

    xw: Tensor
    """``(K, B, T, GH)``."""
    kept: State
    """Each step's ``kept`` stacked on dim 2."""


def run(cell: type[Cell], p: Params, x: Tensor, keep: bool = False) -> tuple[Tensor, Trace | None]:
    """Hidden states ``(K, B, T, H)`` of ``cell`` over ids ``x (K|1, B, T)`` from a zero state."""
    table = p.w_ih.transpose(1, 2) + cell.input_bias(p).unsqueeze(1)  # (K, I, GH)
    xw = embed(table, x)  # (K, B, T, GH)
    h = xw.new_zeros(xw.shape[0], xw.shape[1], p.w_hh.shape[-1])  # (K, B, H)
    state = cell.zero_state(h)
    w_hh_t = p.w_hh.transpose(1, 2)  # (K, H, GH)
    b_hh = p.b_hh.unsqueeze(1)  # (K, 1, GH)
    hs: list[Tensor] = []
    kept: list[State] = []
    for xw_t in xw.unbind(2):
        h, state, kept_t = cell.step(xw_t, h, state, w_hh_t, b_hh)
        hs.append(h)
        if keep:
            kept.append(kept_t)
    trace = None
    if keep:
        trace = Trace(
            xw, tuple(torch.stack([k_t[j] for k_t in kept], dim=2) for j in range(len(kept[0])))
        )
    return torch.stack(hs, dim=2), trace


def readout(p: Params, hs: Tensor) -> Tensor:
    """Sigmoid outputs ``(K, B, T, O)`` of hidden states ``hs (K, B, T, H)``."""
    k, b, t_len, n_h = hs.shape
    z = p.b_out.unsqueeze(1) + small_bmm(hs.reshape(k, b * t_len, n_h), p.w_out.transpose(1, 2))
    return torch.sigmoid(z).view(k, b, t_len, -1)


def backward(
    cell: type[Cell], p: Params, x: Tensor, hs: Tensor, trace: Trace, dy_pre: Tensor
) -> Params:
    """Gradients of every parameter given ``dy_pre (K, B, T, O)``, the loss gradient of the
    readout's pre-sigmoid values; ``hs``/``trace`` come from ``run(..., keep=True)``."""
    k, b, t_len, n_h = hs.shape
    n_in = p.w_ih.shape[-1]
    dz = dy_pre.reshape(k, b * t_len, -1)  # (K, BT, O)
    g_w_out = small_bmm(dz.transpose(1, 2), hs.reshape(k, b * t_len, n_h))  # (K, O, H)
    dhs = small_bmm(dz, p.w_out).view(k, b, t_len, n_h)  # (K, B, T, H)
    dxw, dhw = cell.backward(trace.xw, hs, trace.kept, dhs, p)  # (K, B, T, GH) each
    dxw, dhw = dxw.reshape(k, b * t_len, -1), dhw.reshape(k, b * t_len, -1)
    onehot = torch.nn.functional.one_hot(x, n_in).to(dz.dtype).expand(k, b, t_len, n_in)
    g_w_ih = small_bmm(dxw.transpose(1, 2), onehot.reshape(k, b * t_len, n_in))  # (K, GH, I)
    h_prev = _shift(hs).reshape(k, b * t_len, n_h)
    g_w_hh = small_bmm(dhw.transpose(1, 2), h_prev)  # (K, GH, H)
    return Params(g_w_ih, g_w_hh, dxw.sum(1), dhw.sum(1), g_w_out, dz.sum(1))


# --------------------------------------------------------------------------- loss
def _mean_weights(m: Tensor, n_out: int) -> Tensor:
    lengths = m.sum(-1, keepdim=True).clamp(min=1)  # (K|1, B, 1)
    return m / (n_out * lengths * m.shape[1])


def _token_mean_weights(m: Tensor, n_out: int) -> Tensor:
    return m / (n_out * m.sum((1, 2), keepdim=True).clamp(min=1))


def _sum_weights(m: Tensor, n_out: int) -> Tensor:
    return m


REDUCTIONS = {"mean": _mean_weights, "token_mean": _token_mean_weights, "sum": _sum_weights}
"""Loss reductions: ``mean`` = each sequence's mean over its own ``O * L`` elements,
averaged over the member's ``B`` sequences (the paper's loss at batch size 1);
``token_mean`` = mean over every element of the member's batch; ``sum`` = their sum."""


def loss_weights(mask: Tensor, reduction: str, n_out: int) -> Tensor:
    """Per-step weights ``(K|1, B, T)``: member k's loss is ``sum w * (y - target)^2`` over (B, T, O)."""
    return REDUCTIONS[reduction](mask.to(torch.float32), n_out)


def squared_error(y: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """``sum_o (y - target)^2`` per step ``(K, B, T)``, exactly 0 on padding (even if y is not finite)."""
    se = (y - target).square().sum(-1)
    return torch.where(mask, se, torch.zeros_like(se))


def loss_grad(y: Tensor, target: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """Gradient of ``sum w (y - target)^2`` w.r.t. the readout's pre-sigmoid values ``(K, B, T, O)``."""
    dy = 2 * weights.unsqueeze(-1) * (y - target)
    dy = torch.where(mask.unsqueeze(-1), dy, torch.zeros_like(dy))
    return dy * y * (1 - y)
