"""Real models nobody here wrote: how long partition() and its self-check take, and what the
search did where its exact DP would not fit (nodes fixed, gap to the LP relaxation's bound).

    python bench/real_models.py       # about 2 minutes on 2 cores

Prints a markdown table and writes it to bench/out/real_models.md (the run quoted in README is
kept in bench/results/real_models.md). Wall-clock seconds, one run each, on CPU devices: the
partition at the given batch in float32, then ``ptd.check()`` (a copy at twice the devices'
batch, float64, verified against one device).
"""
import sys
import time
import warnings

import tofu_mx  # noqa: F401  (sets MXNet's environment before MXNet is imported)
from benchlib import write_out
import mxnet as mx

MODELS = [  # (name, zoo, keyword arguments, input shape)
    ("resnet18_v1", "gluon", {"classes": 10}, (32, 3, 64, 64)),
    ("hrnet_w18_small_v1_c", "gluoncv", {"classes": 10}, (16, 3, 64, 64)),
    ("resnest14", "gluoncv", {"classes": 10}, (16, 3, 64, 64)),
    ("simple_pose_resnet18_v1b", "gluoncv", {}, (16, 3, 64, 64)),
]


def symbol_of(name, zoo, kwargs):
    if zoo == "gluon":
        from mxnet.gluon.model_zoo import vision
        net = vision.get_model(name, **kwargs)
    else:
        from gluoncv import model_zoo
        net = model_zoo.get_model(name, pretrained=False, **kwargs)
    net.initialize()
    net.hybridize()
    out = net(mx.sym.var("data"))
    return mx.sym.MakeLoss(mx.sym.sum(mx.sym.square(out)))


def main():
    rows = ["| model | k | partition (s) | check (s) | cuts: nodes fixed (gap) | check |",
            "| --- | ---: | ---: | ---: | --- | --- |"]
    for name, zoo, kwargs, shape in MODELS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sym = symbol_of(name, zoo, kwargs)
        for k in (2, 4):
            ctx = [mx.cpu(i) for i in range(k)]
            start = time.perf_counter()
            ptd = tofu_mx.partition(sym, ctx, data=shape)
            planned = time.perf_counter() - start
            start = time.perf_counter()
            report = ptd.check()
            checked = time.perf_counter() - start
            cuts = ", ".join(f"{lv.fixed} ({'-' if lv.gap is None else f'{lv.gap:.1%}'})"
                             if lv.fixed else "exact" for lv in ptd.plan.levels)
            rows.append(f"| {name} {shape} | {k} | {planned:.2f} | {checked:.2f} | {cuts} | "
                        f"{'ok' if report.ok else 'DIFFERS'}, {len(report.comparisons)} "
                        f"tensors |")
            print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    write_out("real_models.md", text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
