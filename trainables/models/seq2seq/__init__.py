"""The seq2seq family: an LSTM encoder-decoder with Luong attention, bundled over seeds.

Modules: :mod:`.model` (the registered model, its config and loss reductions),
:mod:`.layout` (batches and dropout masks), :mod:`.weights` and :mod:`.cells` (the LSTM
layers, with compiled C kernels on a CPU), :mod:`.logits` (the output layer and its
loss), :mod:`.fast` and :mod:`.stepper` (the fast training step and greedy decoding),
:mod:`.decode` (decoding helpers) and :mod:`.reference` (the plain eager model the fast
path is tested against).
"""

from trainables.models.seq2seq.model import REDUCTIONS, Seq2Seq, Seq2SeqConfig

__all__ = ["REDUCTIONS", "Seq2Seq", "Seq2SeqConfig"]
