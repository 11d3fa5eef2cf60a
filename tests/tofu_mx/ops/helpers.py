"""Shared helpers for the description families' tests."""
from nnvm_passes.importer import import_symbol
from tofu_mx.search.cut import View, op_strategies


def offered(sym, parts=2, **shapes):
    """The names of the strategies the search offers for the one operator of ``sym`` cut in
    ``parts`` (e.g. {"split i0", "reduce r0"}); {"replicate all"} when it has none."""
    graph = import_symbol(sym, **shapes)
    (i,) = [i for i, n in enumerate(graph.nodes) if not n.is_variable]
    return {s.name for s in op_strategies(graph, i, View.of(graph), parts)}
