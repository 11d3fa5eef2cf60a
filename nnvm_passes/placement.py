"""Placement: tag every node of a graph with the ctx group of the device that runs it."""
from __future__ import annotations

from typing import Callable

from nnvm_passes.ir import Graph, Node
from tofu_mx.errors import TofuError


def place(graph: Graph, group_of: Callable[[Node], str]) -> Graph:
    """Put each operator in the ctx group ``group_of(node)``, each variable in its consumer's.

    MXNet inserts the cross-device copies at group boundaries when the symbol is bound with
    ``group2ctx``. A variable read in two groups is rejected: MXNet cannot bind a variable
    whose gradient comes from two devices.
    """
    nodes = list(graph.nodes)
    for i, node in enumerate(nodes):
        if not node.is_variable:
            nodes[i] = node.replace(attrs=node.attrs.updated(__ctx_group__=str(group_of(node))))
    for i, readers in graph.consumers().items():
        if not nodes[i].is_variable or not readers:
            continue
        groups = list(dict.fromkeys(nodes[c].ctx_group for c, _ in readers))
        if len(groups) > 1:
            raise TofuError(
                f"variable {nodes[i].name!r} is read in groups {groups} (by "
                f"{', '.join(nodes[c].name for c, _ in readers[:4])}); MXNet cannot bind a "
                f"variable read on two devices: place its readers in one group")
        nodes[i] = nodes[i].replace(attrs=nodes[i].attrs.updated(__ctx_group__=groups[0]))
    return graph.replace(nodes=tuple(nodes))


def placed_group(graph: Graph, index: int, default: str | None = None) -> str | None:
    """The ctx group node ``index`` runs in, as MXNet places it: its own, or for an untagged
    operator its first input's (``default`` for an untagged operator without inputs)."""
    node = graph.nodes[index]
    while node.ctx_group is None and not node.is_variable:
        if not node.inputs:
            return default
        node = graph.nodes[node.inputs[0].node]
    return node.ctx_group
