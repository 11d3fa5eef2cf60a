"""Small graph-to-graph passes over the IR."""
from __future__ import annotations

from typing import Callable

from nnvm_passes.ir import FrozenDict, Graph, is_hidden_attr
from tofu_mx.errors import TofuError


def disable_dropout(graph: Graph, is_random: Callable[[str], bool]) -> Graph:
    """Replace every operator whose output is random in training (``is_random(op)``: Dropout)
    by the identity (``_copy``), which is what it computes at inference.

    Hidden attributes such as ``__ctx_group__`` are kept, so placement is unchanged. The
    Dropout mask output disappears; a graph that reads the mask is rejected.
    """
    nodes = list(graph.nodes)
    random = {i for i, node in enumerate(nodes) if not node.is_variable and is_random(node.op)}
    changed = False
    for i in sorted(random):
        node = nodes[i]
        nodes[i] = node.replace(
            op="_copy", outputs=node.outputs[:1],
            attrs=FrozenDict({k: v for k, v in node.attrs.items() if is_hidden_attr(k)}))
        changed = True
    if not changed:
        return graph
    for node in nodes:
        for entry in node.inputs:
            if entry.index > 0 and entry.node in random:
                raise TofuError(f"{node.name!r} reads the mask of {graph.nodes[entry.node].name!r};"
                                f" such a graph cannot be made deterministic")
    return graph.replace(nodes=tuple(nodes))
