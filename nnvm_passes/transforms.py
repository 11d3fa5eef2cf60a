"""Small graph-to-graph passes over the IR."""
from __future__ import annotations

from nnvm_passes.ir import FrozenDict, Graph, is_hidden_attr
from tofu_mx.errors import TofuError

#: Operators whose output is random in training mode, and the deterministic operator that
#: :func:`disable_dropout` puts in their place (the identity, i.e. their inference behaviour).
RANDOM_IN_TRAINING = {"Dropout": "_copy"}


def disable_dropout(graph: Graph) -> Graph:
    """Replace every Dropout by the identity (``_copy``), which is what it computes at inference.

    Hidden attributes such as ``__ctx_group__`` are kept, so placement is unchanged. The
    Dropout mask output disappears; a graph that reads the mask is rejected.
    """
    nodes = list(graph.nodes)
    changed = False
    for i, node in enumerate(nodes):
        if node.op not in RANDOM_IN_TRAINING:
            continue
        nodes[i] = node.replace(
            op=RANDOM_IN_TRAINING[node.op], outputs=node.outputs[:1],
            attrs=FrozenDict({k: v for k, v in node.attrs.items() if is_hidden_attr(k)}))
        changed = True
    if not changed:
        return graph
    for node in nodes:
        for entry in node.inputs:
            if entry.index > 0 and graph.nodes[entry.node].op in RANDOM_IN_TRAINING:
                raise TofuError(f"{node.name!r} reads the mask of {graph.nodes[entry.node].name!r};"
                                f" such a graph cannot be made deterministic")
    return graph.replace(nodes=tuple(nodes))
