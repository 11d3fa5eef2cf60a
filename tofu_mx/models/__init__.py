"""The models of Tofu's evaluation, as Symbol builders with a loss head, and Gluon's model zoo.

Each builder returns an ``mx.sym.Symbol`` and allocates nothing, so the paper's sizes can be
built, imported and planned on a laptop. ``input_shapes`` gives the matching input shapes;
:func:`zoo_symbol` and :func:`zoo_input_shapes` do the same for any model-zoo name.
"""
from __future__ import annotations

from tofu_mx.errors import InvalidArgumentError
from tofu_mx.models.rnn import rnn
from tofu_mx.models.transformer import transformer
from tofu_mx.models.wresnet import wresnet
from tofu_mx.models.zoo import ZOO_MODELS, is_zoo_model, zoo_input_shapes, zoo_name, zoo_symbol


def input_shapes(model: str, batch_size: int, *, seq_len: int | None = None,
                 image_size: int = 224) -> dict[str, tuple[int, ...]]:
    """Shapes of ``data`` and ``softmax_label`` for a builder: ``"wresnet"``, ``"rnn"`` or
    ``"transformer"`` (the latter two need ``seq_len``)."""
    if model == "wresnet":
        return {"data": (batch_size, 3, image_size, image_size), "softmax_label": (batch_size,)}
    if model in ("rnn", "transformer"):
        if seq_len is None:
            raise InvalidArgumentError(f"input_shapes({model!r}) needs seq_len=..., got None")
        return {"data": (batch_size, seq_len), "softmax_label": (batch_size, seq_len)}
    raise InvalidArgumentError(f"unknown model {model!r}; expected 'wresnet', 'rnn' or "
                               f"'transformer' (for a model-zoo name: zoo_input_shapes)")


__all__ = ["ZOO_MODELS", "input_shapes", "is_zoo_model", "rnn", "transformer", "wresnet",
           "zoo_input_shapes", "zoo_name", "zoo_symbol"]
