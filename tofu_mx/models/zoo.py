"""Gluon's model zoo (``mxnet.gluon.model_zoo.vision``) as Symbols with a loss head.

``zoo_symbol("resnet50_v1")`` builds the Gluon network, calls it on ``mx.sym.var("data")``
(nothing is initialised, allocated or downloaded) and puts a ``SoftmaxOutput`` named
``softmax`` on top, as MXNet's own symbol builders do, so the graph has the inputs ``data``
and ``softmax_label`` and can be imported, planned, partitioned and trained like
:func:`tofu_mx.models.wresnet`. Parameter names are Gluon's (``resnetv10_conv0_weight``),
the same on every call.
"""
from __future__ import annotations

import difflib
from typing import Any, Sequence

import mxnet as mx

from tofu_mx.errors import InvalidArgumentError

#: every name ``mxnet.gluon.model_zoo.vision.get_model`` accepts in MXNet 1.9.1
ZOO_MODELS = (
    "alexnet",
    "densenet121", "densenet161", "densenet169", "densenet201",
    "inceptionv3",
    "mobilenet0.25", "mobilenet0.5", "mobilenet0.75", "mobilenet1.0",
    "mobilenetv2_0.25", "mobilenetv2_0.5", "mobilenetv2_0.75", "mobilenetv2_1.0",
    "resnet18_v1", "resnet34_v1", "resnet50_v1", "resnet101_v1", "resnet152_v1",
    "resnet18_v2", "resnet34_v2", "resnet50_v2", "resnet101_v2", "resnet152_v2",
    "squeezenet1.0", "squeezenet1.1",
    "vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn",
)

#: the image side a network is built for, where it is not 224
_IMAGE_SIZE = {"inceptionv3": 299}


def is_zoo_model(name: str) -> bool:
    """Whether ``name`` (any case) is a model-zoo name."""
    return isinstance(name, str) and name.lower() in ZOO_MODELS


def zoo_name(name: str, others: Sequence[str] = ()) -> str:
    """``name`` as the model zoo spells it (lower case). Anything else raises
    :class:`tofu_mx.InvalidArgumentError` naming the closest model-zoo names and ``others``
    (the other models the caller accepts)."""
    if is_zoo_model(name):
        return name.lower()
    known = list(others) + list(ZOO_MODELS)
    close = difflib.get_close_matches(str(name).lower(), known, n=4, cutoff=0.5)
    examples = list(others) + ["resnet50_v1", "mobilenetv2_1.0", "inceptionv3"]
    hint = f"did you mean {', '.join(close)}?" if close else f"e.g. {', '.join(examples)}"
    raise InvalidArgumentError(
        f"unknown model {name!r}; {hint} (every model-zoo name: tofu_mx.models.ZOO_MODELS)")


def zoo_symbol(name: str, classes: int = 1000, **kwargs: Any) -> mx.sym.Symbol:
    """The model-zoo network ``name`` (``vision.get_model(name, classes=classes, **kwargs)``)
    traced as a Symbol with a ``SoftmaxOutput`` head named ``softmax``.

    Unknown names raise :class:`tofu_mx.InvalidArgumentError` with the closest names. Only the
    graph is built: ``pretrained=True`` is refused (load the weights with Gluon and pass them
    to :meth:`tofu_mx.PartitionedSymbol.set_params`).
    """
    name = zoo_name(name)
    if kwargs.get("pretrained"):
        raise InvalidArgumentError(
            f"zoo_symbol({name!r}) builds the graph only and downloads nothing; load pretrained "
            f"weights with mxnet.gluon.model_zoo.vision.get_model({name!r}, pretrained=True) "
            f"and hand them to PartitionedSymbol.set_params")
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise InvalidArgumentError(f"classes must be a positive int, got {classes!r}")
    from mxnet.gluon.model_zoo import vision
    # a fresh NameManager: Gluon numbers its blocks per manager, so the names do not depend
    # on how many networks were built before
    with mx.name.NameManager():
        try:
            net = vision.get_model(name, classes=classes, **kwargs)
        except TypeError as e:
            raise InvalidArgumentError(f"vision.get_model({name!r}) does not take these "
                                       f"arguments {sorted(kwargs)}: {e}") from e
        out = net(mx.sym.var("data"))
    return mx.sym.SoftmaxOutput(out, name="softmax")


def zoo_input_shapes(name: str, batch_size: int, image_size: int | None = None
                     ) -> dict[str, tuple[int, ...]]:
    """Shapes of ``data`` (NCHW images, ``image_size`` square: by default 299 for
    ``inceptionv3``, 224 otherwise) and ``softmax_label`` for :func:`zoo_symbol`."""
    name = zoo_name(name)
    for what, value in (("batch_size", batch_size), ("image_size", image_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise InvalidArgumentError(f"{what} must be a positive int, got {value!r}")
    side = image_size or _IMAGE_SIZE.get(name, 224)
    return {"data": (batch_size, 3, side, side), "softmax_label": (batch_size,)}
