"""Embedding and sequence operators: Embedding, SequenceMask, SequenceLast, SequenceReverse."""
from tofu_mx.tdl import Shard, index, lam, less, op, where


def _embedding_shard(attrs, ctx):
    return Shard({"output_dim": ctx.size(ctx.outputs[0])[-1],
                  "input_dim": ctx.size(ctx.inputs[1])[0]})


def _mask_shard(attrs, ctx):
    """The mask compares the step with the lengths: a share must start at step 0."""
    axis = int(attrs.get("axis", 0))
    return Shard() if ctx.outputs[0][axis][0] == 0 else None


def _lengths(attrs, shapes):
    """Sequence lengths: 1 up to the number of steps on the time axis."""
    return 1, shapes[0][int(attrs.get("axis", 0))] + 1


@op("Embedding", shard=_embedding_shard, index_inputs={0: lambda a, s: (0, int(a["input_dim"]))},
    examples=[({"input_dim": 7, "output_dim": 3}, [(2, 4), (7, 3)]),
                           ({"input_dim": 5, "output_dim": 2}, [(6,), (5, 2)])])
def embedding(attrs, data, weight):
    """out[..., d] = weight[data[...], d]: a data-dependent index, so a split of the token
    axes needs the whole table; a split of ``d`` needs the matching columns."""
    lead = data.ndim
    return lam(lead + 1, lambda *i: weight[index(data[i[:lead]]), i[lead]])


@op("SequenceMask", shard=_mask_shard, index_inputs={1: _lengths}, examples=[({"use_sequence_length": True}, [(5, 3, 2), (3,)]),
                              ({"use_sequence_length": True, "value": -1.0, "axis": 1}, [(3, 5, 2), (3,)]),
                              ({}, [(4, 2)])])
def sequence_mask(attrs, data, sequence_length=None):
    """Steps at or past a sequence's length become ``value`` (time on ``axis`` 0 or 1, batch on
    the other)."""
    if not attrs.get("use_sequence_length", False) or sequence_length is None:
        return lam(data.ndim, lambda *i: data[i])
    axis = int(attrs.get("axis", 0))
    batch = 1 - axis
    value = float(attrs.get("value", 0.0))
    return lam(data.ndim, lambda *i: where(less(i[axis], sequence_length[i[batch]]), data[i], value))


@op("SequenceLast", index_inputs={1: _lengths}, examples=[
    ({"use_sequence_length": True}, [(5, 3, 2), (3,)]),
    ({"use_sequence_length": True, "axis": 1}, [(3, 5, 2), (3,)]),
    ({"use_sequence_length": True}, [(4, 2), (2,)]), ({}, [(4, 3, 2)]), ({"axis": 1}, [(2, 4)])])
def sequence_last(attrs, data, sequence_length=None):
    """out[b, ...] = data[last, b, ...] (time on ``axis`` 0 or 1, batch on the other): the last
    step, or step ``length[b] - 1``. Without lengths a share reads one step, and the operator
    run on that one step gives it."""
    axis = int(attrs.get("axis", 0))
    rest = data.ndim - 2

    def out(b, *r):
        if attrs.get("use_sequence_length", False) and sequence_length is not None:
            t = index(sequence_length[b] - 1.0)
        else:
            t = data.shape[axis] - 1
        return data[((t, b) if axis == 0 else (b, t)) + r]
    return lam(["b"] + [f"r{k}" for k in range(rest)], out)


@op("SequenceReverse", index_inputs={1: _lengths}, examples=[
    ({"use_sequence_length": True}, [(5, 3, 2), (3,)]),
    ({"use_sequence_length": True}, [(4, 2), (2,)]), ({}, [(4, 3, 2)]), ({}, [(5, 2)])])
def sequence_reverse(attrs, data, sequence_length=None):
    """Time on axis 0 (MXNet supports no other): out[t, b, ...] = data[L - 1 - t, b, ...] for
    t < L = length[b] (the whole axis without lengths); the padding past L stays in place.
    Without lengths a share of steps reads the mirrored steps, and reversing them gives it."""
    if not attrs.get("use_sequence_length", False) or sequence_length is None:
        last = data.shape[0] - 1
        return lam(data.ndim, lambda t, *i: data[(last - t,) + i])

    def out(t, b, *r):
        length = sequence_length[b]
        return where(less(t, length), data[(index(length - 1.0 - t), b) + r], data[(t, b) + r])
    return lam(["t", "b"] + [f"r{k}" for k in range(data.ndim - 2)], out)
