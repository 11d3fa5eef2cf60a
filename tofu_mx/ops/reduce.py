"""Reductions and softmax."""
import numpy as np

from tofu_mx.tdl import Max, Min, Shard, Sum, exp, lam, log, op

_KINDS = {"sum": Sum, "mean": Sum, "max": Max, "min": Min}


def _reduced_axes(attrs, ndim):
    axis = attrs.get("axis", None)
    if axis is None or axis == ():
        axes = set(range(ndim))
    else:
        axes = {a % ndim for a in (axis if isinstance(axis, tuple) else (axis,))}
    if attrs.get("exclude", False):
        axes = set(range(ndim)) - axes
    return sorted(axes)


def _reduction(name):
    examples = [({"axis": 1}, [(2, 3, 4)]), ({"axis": (0, 2), "keepdims": True}, [(2, 3, 4)]),
                ({}, [(2, 3)]), ({"axis": 1, "exclude": True}, [(2, 3, 4)]), ({"axis": -1}, [(3, 5)])]

    def shard(attrs, ctx):
        """A mean's partial is a sum over the share's slice divided by its own count."""
        if name != "mean" or ctx.partial is None:
            return Shard()
        axes = _reduced_axes(attrs, len(ctx.input_shapes[0]))
        size = ctx.size(ctx.inputs[0])
        return Shard(scale=float(np.prod([size[a] for a in axes]) /
                                 np.prod([ctx.input_shapes[0][a] for a in axes])))

    @op(name, examples=examples, shard=shard)
    def describe(attrs, data):
        axes = _reduced_axes(attrs, data.ndim)
        kept = [a for a in range(data.ndim) if a not in axes]
        keepdims = attrs.get("keepdims", False)
        out_rank = len(attrs.output_shapes[0])
        count = 1
        for a in axes:
            count *= data.shape[a]

        def out(*i):
            positions = list(range(data.ndim)) if keepdims else kept
            coords = dict(zip(positions, i)) if out_rank == len(positions) else {}

            def body(*r):
                index = [coords.get(a) for a in range(data.ndim)]
                for a, v in zip(axes, r):
                    index[a] = v
                return data[tuple(index)]
            total = _KINDS[name](lam(len(axes), body, prefix="r"))
            return total / count if name == "mean" else total
        return lam(out_rank, out)
    return describe


for _name in _KINDS:
    _reduction(_name)


def _softmax_over(data, axis, temperature, use_log):
    axis %= data.ndim

    def out(*i):
        def along(v):
            return data[tuple(v if a == axis else x for a, x in enumerate(i))] / temperature
        top = Max(lambda m: along(m))
        total = Sum(lambda j: exp(along(j) - top))
        shifted = data[i] / temperature - top
        return shifted - log(total) if use_log else exp(shifted) / total
    return lam(data.ndim, out)


@op("softmax", examples=[({"axis": -1}, [(2, 3, 4)]), ({"axis": 1}, [(2, 3, 4)]), ({}, [(3, 5)]),
                         ({"axis": -1, "temperature": 2.0}, [(2, 4)])])
def softmax(attrs, data):
    temperature = attrs.get("temperature", None) or 1.0
    return _softmax_over(data, int(attrs.get("axis", -1)), float(temperature), use_log=False)


@op("log_softmax", examples=[({"axis": -1}, [(2, 3, 4)]), ({"axis": 0}, [(3, 5)])])
def log_softmax(attrs, data):
    temperature = attrs.get("temperature", None) or 1.0
    return _softmax_over(data, int(attrs.get("axis", -1)), float(temperature), use_log=True)
