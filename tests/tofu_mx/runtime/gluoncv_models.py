"""GluonCV 0.10.5's model zoo at small sizes, built as its users build them (``get_model``
with ``pretrained=False``), nothing downloaded: detection with its training-mode outputs,
segmentation, pose, ResNeSt, HRNet and video nets. Each builder returns ``(symbol, shapes,
dtype)``; the loss is the sum of squares of every output. float64, except SSD, whose
feature expander does not cast (judged in float32 against a float64 oracle)."""
import warnings

import mxnet as mx
from mxnet import autograd


def _outputs(out):
    if isinstance(out, (list, tuple)):
        for o in out:
            yield from _outputs(o)
    else:
        yield out


def _zoo(name, shape, dtype="float64", train_mode=False, **kwargs):
    from gluoncv import model_zoo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = model_zoo.get_model(name, pretrained=False, **kwargs)
        net.initialize()
        net.cast(dtype)
        net.hybridize()
        if train_mode:       # the raw outputs a detector trains on
            with autograd.train_mode():
                out = net(mx.sym.var("data"))
        else:
            out = net(mx.sym.var("data"))
    outs = list(_outputs(out))
    loss = mx.sym.MakeLoss(mx.sym.add_n(*[mx.sym.sum(mx.sym.square(o)) for o in outs]))
    return loss, {"data": shape}, dtype


def _video(name, frames):
    return lambda: _zoo(name, (1, 3, frames, 32, 32), num_classes=5, pretrained_base=False) \
        if "r2plus1d" not in name else _zoo(name, (1, 3, frames, 32, 32), num_classes=5)


def _segmentation(name):
    return lambda: _zoo(name, (1, 3, 32, 32), pretrained_base=False, aux=False, crop_size=32,
                        height=32, width=32)


#: name -> builder; SLOW: only under ``-m slow`` (each takes over 8 s a device count)
MODELS = {
    "yolo3_mobilenet1.0_voc": lambda: _zoo("yolo3_mobilenet1.0_voc", (1, 3, 64, 64),
                                           train_mode=True, pretrained_base=False),
    "ssd_512_mobilenet1.0_voc": lambda: _zoo("ssd_512_mobilenet1.0_voc", (1, 3, 64, 64),
                                             dtype="float32", train_mode=True,
                                             pretrained_base=False),
    "fcn_resnet50_voc": _segmentation("fcn_resnet50_voc"),
    "deeplab_resnet101_voc": _segmentation("deeplab_resnet101_voc"),
    "psp_resnet101_voc": _segmentation("psp_resnet101_voc"),
    "simple_pose_resnet18_v1b": lambda: _zoo("simple_pose_resnet18_v1b", (2, 3, 32, 32)),
    "resnest14": lambda: _zoo("resnest14", (2, 3, 32, 32), classes=5),
    "hrnet_w18_small_v1_c": lambda: _zoo("hrnet_w18_small_v1_c", (4, 3, 64, 64), classes=5),
    "r2plus1d_resnet18_kinetics400": _video("r2plus1d_resnet18_kinetics400", 4),
    "i3d_resnet50_v1_kinetics400": _video("i3d_resnet50_v1_kinetics400", 8),
    "slowfast_4x16_resnet50_kinetics400": _video("slowfast_4x16_resnet50_kinetics400", 36),
}
SLOW = {"deeplab_resnet101_voc", "psp_resnet101_voc", "slowfast_4x16_resnet50_kinetics400"}
