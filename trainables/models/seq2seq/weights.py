"""The fast seq2seq implementation's weights: the stacked parameters rearranged for computation.

:func:`build_weights` turns the stacked parameters (:mod:`layout`) into the gate
layout of the hand-written LSTM (:mod:`cells`) and, for evaluation, into its
evaluation form (doubled ``g`` weights and combine layer, per-token input-projection
tables); autograd flows through. Shared by the engine (:mod:`fast`) and the
decoding stepper (:mod:`stepper`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainables.models.ckernels import KernelChoice
from trainables.models.seq2seq.cells import (
    double_g,
    lstm_sequence,
    lstm_sequence_eval,
    prepare_gates,
)
from trainables.models.seq2seq.layout import Arch, pad_classes


@dataclass
class Layer:
    """One LSTM layer (one direction) in the cell's gate layout (see :mod:`cells`)."""

    w_ih_t: torch.Tensor  # (K, in, 4H)
    bias: torch.Tensor  # (K, 1, 4H) = b_ih + b_hh
    w_hh: torch.Tensor  # (K, 4H, H)


@dataclass
class Weights:
    """The stacked parameters rearranged for computation (autograd flows through)."""

    src_emb: torch.Tensor  # (K * Vs, E)
    tgt_emb: torch.Tensor  # (K * Vt, E)
    encoder: list[list[Layer]]  # [layer][direction]
    decoder: list[Layer]
    attn_t: torch.Tensor | None  # (K, He, Hd)
    comb_ctx_t: torch.Tensor | None  # (K, He, Hd)
    comb_h_t: torch.Tensor | None  # (K, Hd, Hd)
    out_t: torch.Tensor  # (K, Hd, V): every target id (zero columns for ids left out)
    out_b: torch.Tensor  # (K, 1, V): EXCLUDED_LOGIT for ids left out (Arch.out_offset)
    evaluation: bool = False
    """Evaluation form: every tanh is computed as ``2 sigmoid(2x) - 1``, so the LSTM g
    blocks and the combine layer are stored doubled (exact), and layer 0's input
    projections are looked up per token in the tables below."""
    src_table: list[torch.Tensor] | None = None
    """Evaluation: per encoder direction, ``emb W_ih^T + b`` of every source token (K * Vs, 4H)."""
    tgt_table: torch.Tensor | None = None
    """Evaluation: the same for decoder layer 0 over target tokens (K * Vt, 4Hd)."""
    kern: KernelChoice = "default"
    """The compiled CPU kernels every computation with these weights uses: the model's
    choice, made once at its construction (None: torch ops; see :mod:`ckernels`)."""
    attention_tanh: bool = True
    """The attentional state is ``tanh`` of the combine layer's output (``Arch.attention_tanh``);
    False: the output itself, and the combine weights are not doubled in evaluation."""

    def lstm(
        self,
        inputs: torch.Tensor,
        layer: Layer,
        h0: torch.Tensor,
        c0: torch.Tensor,
        active: tuple[int, ...] = (),
        looked_up: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer over all steps: inputs (K, T, B, in) -> hs, cs (K, T, B, H); with
        ``looked_up`` (evaluation) the inputs are already the input projections, biases
        included (K, T, B, 4H), from a table. In training, step t computes only the first
        ``active[t]`` rows (all where empty), and the layer projects its inputs itself."""
        if self.evaluation:
            xp = inputs if looked_up else project_inputs(inputs, layer)
            return lstm_sequence_eval(xp, layer.w_hh, h0, c0, self.kern)
        assert not looked_up, "training has no projection tables"
        w_ih = layer.w_ih_t.transpose(1, 2)  # (K, 4H, in)
        return lstm_sequence(inputs, w_ih, layer.w_hh, h0, c0, active, layer.bias, self.kern)

    def combine_act_(self, x: torch.Tensor) -> torch.Tensor:
        """The attentional state from a pre-activation made with the combine weights: its
        tanh (the weights doubled in evaluation), or ``x`` itself without ``attention_tanh``."""
        if not self.attention_tanh:
            return x
        return torch.sigmoid(x, out=x).mul_(2.0).sub_(1.0) if self.evaluation else x.tanh()


def layer_weights(
    p: Mapping[str, torch.Tensor], prefix: str, suffix: str, hidden: int, doubled: bool
) -> Layer:
    w_ih = prepare_gates(p[f"{prefix}_weight_ih_{suffix}"], hidden)
    w_hh = prepare_gates(p[f"{prefix}_weight_hh_{suffix}"], hidden)
    bias = prepare_gates(p[f"{prefix}_bias_ih_{suffix}"] + p[f"{prefix}_bias_hh_{suffix}"], hidden)
    if doubled:
        w_ih, w_hh, bias = double_g(w_ih, hidden, 1), double_g(w_hh, hidden, 1), double_g(bias, hidden)
    return Layer(w_ih.transpose(1, 2), bias.unsqueeze(1), w_hh)


def token_table(emb: torch.Tensor, layer: Layer) -> torch.Tensor:
    """Input projection of every token: emb (K, V, E) -> (K * V, 4H) (incl. both biases)."""
    return torch.baddbmm(layer.bias, emb, layer.w_ih_t).flatten(0, 1)


def build_weights(
    arch: Arch,
    p: Mapping[str, torch.Tensor],
    evaluation: bool = False,
    kern: KernelChoice = "default",
) -> Weights:
    dirs = ["", "_reverse"][: arch.directions]
    layers = range(arch.layers)
    ev = evaluation
    encoder = [[layer_weights(p, "encoder", f"l{n}{d}", arch.hidden, ev) for d in dirs] for n in layers]
    decoder = [layer_weights(p, "decoder", f"l{n}", arch.dec_hidden, ev) for n in layers]
    attn_t = comb_ctx_t = comb_h_t = None
    if arch.attention:
        attn_t = p["attn_weight"].transpose(1, 2)
        doubled = ev and arch.attention_tanh  # tanh(x) = 2 sigmoid(2x) - 1 in evaluation
        comb = p["combine_weight"] * 2.0 if doubled else p["combine_weight"]  # (K, Hd, He + Hd)
        comb_ctx_t = comb[:, :, : arch.enc_out].transpose(1, 2)
        comb_h_t = comb[:, :, arch.enc_out :].transpose(1, 2)
    return Weights(
        src_emb=p["src_emb_weight"].flatten(0, 1),
        tgt_emb=p["tgt_emb_weight"].flatten(0, 1),
        encoder=encoder,
        decoder=decoder,
        attn_t=attn_t,
        comb_ctx_t=comb_ctx_t,
        comb_h_t=comb_h_t,
        out_t=pad_classes(p["out_weight"].transpose(1, 2), arch.out_offset, 0.0),
        out_b=pad_classes(p["out_bias"].unsqueeze(1), arch.out_offset),
        evaluation=ev,
        src_table=[token_table(p["src_emb_weight"], cell) for cell in encoder[0]] if ev else None,
        tgt_table=token_table(p["tgt_emb_weight"], decoder[0]) if ev else None,
        kern=kern,
        attention_tanh=arch.attention_tanh,
    )


def embed_members(table: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Per-member lookup: ids (K, ...) into the (K * V, E) stacked table -> (K, ..., E)."""
    k = ids.shape[0]
    offsets = torch.arange(k, device=ids.device).mul_(vocab).view(k, *[1] * (ids.dim() - 1))
    return F.embedding(ids + offsets, table)


def project_inputs(x: torch.Tensor, layer: Layer) -> torch.Tensor:
    """Evaluation's input projections of all steps in one matmul, biases included: x (K, T,
    B, in) -> (K, T, B, 4H). (Training projects inside the layer, :func:`lstm_sequence`.)"""
    k, t, b, e = x.shape
    return torch.baddbmm(layer.bias, x.reshape(k, t * b, e), layer.w_ih_t).view(k, t, b, -1)


def time_gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (K, T, B, F), index (K, T', B) -> x[k, index[k, t, b], b] (K, T', B, F)."""
    return torch.gather(x, 1, index.unsqueeze(-1).expand(*index.shape, x.shape[-1]))
