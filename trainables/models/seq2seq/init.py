"""Initialisation ``tf``: what Li et al.'s (2021) TensorFlow 1 SCAN code draws.

Their model (``s2s_model.py`` of github.com/yuanpeng16/BCDLSG, the "Gradient Descent
Resists Compositionality" code) sets two initialisers itself and leaves the rest to TF 1's
defaults:

* source and target embeddings: ``tf.random_uniform(..., -1.0, 1.0)``, i.e. U(-1, 1)
  (not Keras's ``Embedding`` default U(-0.05, 0.05));
* LSTMs (``tf.nn.rnn_cell.BasicLSTMCell``): ONE kernel ``[input + H, 4H]`` over the
  concatenation ``[x; h]``, created without an initialiser, so ``get_variable``'s default
  Glorot-uniform with fan_in = input + H and fan_out = 4H: U(+-sqrt(6 / (input + 5H))) for
  the input and the recurrent weights alike (Keras's ``LSTM`` layer would draw an
  orthogonal recurrent kernel; this cell does not); bias ``zeros_initializer``; the forget
  gate adds ``forget_bias=1.0`` in every step, which is the same function, with the same
  gradients, as a forget-gate bias that starts at 1 (here: ``bias_ih``'s forget rows 1,
  ``bias_hh`` 0, their sum is what the cell adds);
* dense layers (``LuongAttention``'s memory layer = ``W_a``, ``AttentionWrapper``'s attention
  layer = ``W_c``, ``tf.layers.dense`` = the output layer): Glorot-uniform kernels over
  (fan_in = inputs, fan_out = units), biases (the output layer's) zero.

A weight of torch layout ``(out, in)`` is a TF kernel ``[in, out]``; the bound of an iid
uniform draw depends only on the fans, so the draws' distribution is TF's. Each parameter
is drawn in registration order from the member's generator, on the CPU, like ``uniform``.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

LSTM_WEIGHT = re.compile(
    r"^(?P<module>encoder|decoder)_weight_(?:ih|hh)_(?P<layer>l\d+(?:_reverse)?)$"
)
LSTM_BIAS = re.compile(r"^(?:encoder|decoder)_bias_(?P<kind>ih|hh)_l\d+(?:_reverse)?$")


def glorot_bound(fan_in: int, fan_out: int) -> float:
    """Glorot-uniform's bound: sqrt(6 / (fan_in + fan_out))."""
    return math.sqrt(6.0 / (fan_in + fan_out))


def tf_draw(
    name: str, shape: torch.Size, shapes: dict[str, torch.Size], g: torch.Generator
) -> torch.Tensor:
    """One member's value of the stacked parameter ``name`` (per-member ``shape``);
    ``shapes`` holds every parameter's per-member shape (an LSTM weight's fans need both)."""
    if name.endswith("_emb_weight"):
        return torch.empty(shape).uniform_(-1.0, 1.0, generator=g)
    weight = LSTM_WEIGHT.match(name)
    if weight:
        module, layer = weight["module"], weight["layer"]
        n_in = shapes[f"{module}_weight_ih_{layer}"][1]
        hid = shapes[f"{module}_weight_hh_{layer}"][1]
        a = glorot_bound(n_in + hid, 4 * hid)
        return torch.empty(shape).uniform_(-a, a, generator=g)
    bias = LSTM_BIAS.match(name)
    if bias:
        out = torch.zeros(shape)
        if bias["kind"] == "ih":
            hid = shape[0] // 4
            out[hid : 2 * hid] = 1.0  # torch's gate order i, f, g, o: the forget gate
        return out
    if name.endswith("_bias"):
        return torch.zeros(shape)
    fan_out, fan_in = shape  # a dense weight (out, in): attn, combine, out
    a = glorot_bound(fan_in, fan_out)
    return torch.empty(shape).uniform_(-a, a, generator=g)


def init_tf(model: nn.Module, member: int, generator: torch.Generator) -> None:
    """Fill member ``member`` of a :class:`~trainables.models.seq2seq.model.Seq2Seq` (stacked
    parameters ``(K, ...)``) with the ``tf`` initialisation (see the module doc)."""
    params = dict(model.named_parameters())
    shapes = {n: p.shape[1:] for n, p in params.items()}
    with torch.no_grad():
        for name, p in params.items():
            p[member].copy_(tf_draw(name, shapes[name], shapes, generator))
