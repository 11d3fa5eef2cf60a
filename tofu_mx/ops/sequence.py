"""Embedding and sequence operators."""
from tofu_mx.tdl import Shard, index, lam, less, op, where


def _embedding_shard(attrs, ctx):
    return Shard({"output_dim": ctx.size(ctx.outputs[0])[-1],
                  "input_dim": ctx.size(ctx.inputs[1])[0]})


def _mask_shard(attrs, ctx):
    """The mask compares the step with the lengths: a share must start at step 0."""
    axis = int(attrs.get("axis", 0))
    return Shard() if ctx.outputs[0][axis][0] == 0 else None


@op("Embedding", shard=_embedding_shard, examples=[({"input_dim": 7, "output_dim": 3}, [(2, 4), (7, 3)]),
                           ({"input_dim": 5, "output_dim": 2}, [(6,), (5, 2)])])
def embedding(attrs, data, weight):
    """out[..., d] = weight[data[...], d]: a data-dependent index, so a split of the token
    axes needs the whole table; a split of ``d`` needs the matching columns."""
    lead = data.ndim
    return lam(lead + 1, lambda *i: weight[index(data[i[:lead]]), i[lead]])


@op("SequenceMask", shard=_mask_shard, examples=[({"use_sequence_length": True}, [(5, 3, 2), (3,)]),
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
