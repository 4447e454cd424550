"""The bundled convnet of Li et al. 2021 for image ``classify`` tasks (paired MNIST).

Per member (Keras layers of the paper, ``valid`` convolutions)::

    Conv(32, 3x3) ReLU -> MaxPool 2 -> Conv(64, 3x3) ReLU -> Flatten
    -> Dense 64 ReLU -> Dense 64 ReLU -> Dense n_classes

trained with the categorical hinge loss by default. On a (1, 28, 56) input: (32, 26, 54)
-> (32, 13, 27) -> (64, 11, 25) -> 17,600 features.

Bundle layout: conv weights ``(K, out, in, 3, 3)``, biases ``(K, out)``, dense weights
``(K, out, in)``; the dense head is one ``baddbmm`` per layer over the members. The
convolutions have two implementations (config ``conv_impl``):

* ``"loop"`` (default): one ``conv2d`` per member on its own slices. Its forward AND
  backward run exactly the kernels of a lone run, so member k is bit-identical to the
  lone K=1 model (the contract's 1e-5 after 200 Adam steps holds with margin).
* ``"grouped"``: one grouped convolution for all members (``groups=K`` over the members'
  stacked channels, input (B, K*C, H, W)); when every member sees the same rows
  (evaluation) the first convolution is an ordinary one with K*C1 output channels over
  the shared input. The forward is bit-identical, but the weight gradients are summed in
  another order (differences ~1e-8 per step on CPU) which Adam amplifies to ~1e-4 after
  200 steps. Fewer kernel launches: the choice for large bundles on a GPU.

Measured (2-core CPU, one thread, batch 32, Adam, the paper config; member-samples/s):
K=1 about 960; K=4 grouped 820, ``torch.func.vmap`` over ``functional_call`` 860, loop 890;
K=10 grouped 470-590, vmap 480-490, loop 480. The three are equal within noise (vmap
lowers to the same grouped convolution), hence the exact loop as default and no vmap.
On a CPU, bundling does not pay for this model: it is compute-bound at K=1 and each
member's 1.1M-parameter first dense layer and activations push larger bundles out of
cache; bundle it on a GPU, run K=1 trials on CPUs.

Predictions are class-probability vectors (softmax of the logits; see ``models/mlp.py``).
No fused step (``make_fused_step`` returns None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import field_validator
from torch import nn

from trainables.configbase import FrozenConfig
from trainables.errors import ConfigError
from trainables.models.classify import (
    BundledClassifier,
    ClassifierConfig,
    ClassifyBatch,
    LossName,
    check_sizes,
    dense_forward,
    dense_stack,
    init_weight_bias,
)
from trainables.registry import MODELS

KERNEL = 3
POOL = 2
EVAL_CHUNK = 1024
"""Evaluation (no grad) runs at most this many member-examples at once: the first
convolution's output is ~5.6 KB per member-example on a 28x56 input (1,000 examples of
a K=10 bundle would otherwise hold 1.8 GB)."""


def feature_shape(input_shape: Sequence[int], channels: tuple[int, int]) -> tuple[int, int, int]:
    """(C2, H2, W2) after conv -> pool -> conv, for an input (C, H, W); ConfigError if too small."""
    if len(input_shape) != 3:
        raise ConfigError(
            "model.name",
            f"convnet needs image inputs (C, H, W) but the task gives input_shape {tuple(input_shape)}",
            "use model mlp for this task",
        )
    _, h, w = input_shape
    h2, w2 = (h - KERNEL + 1) // POOL - KERNEL + 1, (w - KERNEL + 1) // POOL - KERNEL + 1
    if h2 < 1 or w2 < 1:
        raise ConfigError(
            "model.name",
            f"input {tuple(input_shape)} is too small for two 3x3 convolutions and a 2x2 pool",
            "use images of at least 8x8, or model mlp",
        )
    return channels[1], h2, w2


class ConvNetConfig(ClassifierConfig):
    """Bundled convnet settings (``init`` as in ClassifierConfig)."""

    channels: tuple[int, int] = (32, 64)
    """Output channels of the two 3x3 convolutions."""
    hidden: tuple[int, ...] = (64, 64)
    """Dense hidden layer sizes after the flatten, each followed by ReLU."""
    loss: LossName = "hinge"
    """Training loss: "hinge" (categorical hinge on the logits), "categorical_hinge" (Keras's, which
    the paper's code uses: :func:`~trainables.models.classify.classify_losses`) or "cross_entropy"."""
    conv_impl: Literal["loop", "grouped"] = "loop"
    """Bundle convolutions: "loop" (one conv per member, bit-identical to lone runs) or
    "grouped" (one grouped conv; fewer GPU kernel launches, gradients equal only to ~1e-8
    per step). See the module docstring."""

    @field_validator("channels")
    @classmethod
    def _channels(cls, value: tuple[int, int]) -> tuple[int, int]:
        return check_sizes("model.channels", value)  # type: ignore[return-value]

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return check_sizes("model.hidden", value)


@MODELS.register
class ConvNet(BundledClassifier):
    """Two 3x3 convolutions, a max-pool and a dense head, for K members at once."""

    name: ClassVar[str] = "convnet"
    Config: ClassVar[type[FrozenConfig]] = ConvNetConfig
    tiny: ClassVar[dict[str, Any]] = {"channels": (4, 8), "hidden": (16,)}

    config: ConvNetConfig

    def __init__(self, config: FrozenConfig, meta: dict[str, Any], k: int) -> None:
        super().__init__(config, meta, k)
        c_in = int(meta["input_shape"][0])
        c1 = self.config.channels[0]
        c2, h2, w2 = feature_shape(meta["input_shape"], self.config.channels)
        self.conv1_w = nn.Parameter(torch.zeros(k, c1, c_in, KERNEL, KERNEL))
        self.conv1_b = nn.Parameter(torch.zeros(k, c1))
        self.conv2_w = nn.Parameter(torch.zeros(k, c2, c1, KERNEL, KERNEL))
        self.conv2_b = nn.Parameter(torch.zeros(k, c2))
        sizes = [c2 * h2 * w2, *self.config.hidden, int(meta["n_classes"])]
        self.weights, self.biases = dense_stack(sizes, k)

    def init_member(self, member: int, generator: torch.Generator) -> None:
        """conv1, conv2, then the dense layers; each weight then bias (as torch draws them)."""
        scheme = self.config.init
        init_weight_bias(self.conv1_w[member], self.conv1_b[member], scheme, generator)
        init_weight_bias(self.conv2_w[member], self.conv2_b[member], scheme, generator)
        for w, b in zip(self.weights, self.biases, strict=True):
            init_weight_bias(w[member], b[member], scheme, generator)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (K|1, B, C, H, W) -> flattened features (K, B, C2*H2*W2)."""
        if self.config.conv_impl == "grouped":
            return self._features_grouped(x)
        feats = []
        for m in range(self.k):
            xm = x[0] if x.shape[0] == 1 else x[m]  # (B, C, H, W)
            h = F.conv2d(xm, self.conv1_w[m], self.conv1_b[m])  # (B, C1, H1, W1)
            h = F.max_pool2d(torch.relu(h), POOL)  # (B, C1, H1/2, W1/2)
            h = torch.relu(F.conv2d(h, self.conv2_w[m], self.conv2_b[m]))  # (B, C2, H2, W2)
            feats.append(h.flatten(1))
        return torch.stack(feats)  # (K, B, C2*H2*W2)

    def _features_grouped(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`features` as grouped convolutions over the members' stacked channels."""
        k, b = self.k, x.shape[1]
        w1 = self.conv1_w.flatten(0, 1)  # (K*C1, C, 3, 3)
        if x.shape[0] == 1:
            h = F.conv2d(x[0], w1, self.conv1_b.flatten())  # (B, K*C1, H1, W1)
        else:
            stacked = x.transpose(0, 1).flatten(1, 2)  # (B, K*C, H, W)
            h = F.conv2d(stacked, w1, self.conv1_b.flatten(), groups=k)  # (B, K*C1, H1, W1)
        h = F.max_pool2d(torch.relu(h), POOL)  # (B, K*C1, H1/2, W1/2)
        h = F.conv2d(h, self.conv2_w.flatten(0, 1), self.conv2_b.flatten(), groups=k)
        h = torch.relu(h)  # (B, K*C2, H2, W2)
        return h.reshape(b, k, -1).transpose(0, 1)  # (K, B, C2*H2*W2)

    def forward(self, batch: ClassifyBatch) -> torch.Tensor:
        """Logits (K, B, n_classes); without grad, in chunks of ``EVAL_CHUNK`` member-examples."""
        x = batch.x  # (K|1, B, C, H, W)
        step = max(1, EVAL_CHUNK // self.k)
        if torch.is_grad_enabled() or x.shape[1] <= step:
            return dense_forward(self.features(x), self.weights, self.biases)
        parts = [
            dense_forward(self.features(x[:, i : i + step]), self.weights, self.biases)
            for i in range(0, x.shape[1], step)
        ]
        return torch.cat(parts, dim=1)
