"""Passes over MXNet's NNVM graph: import with shapes, export, and graph-to-graph rewrites."""
from nnvm_passes.exporter import export_symbol, graph_to_json
from nnvm_passes.importer import import_symbol
from nnvm_passes.ir import Entry, FrozenDict, Graph, Node, TensorInfo
from nnvm_passes.placement import place
from nnvm_passes.transforms import disable_dropout

__all__ = ["Entry", "FrozenDict", "Graph", "Node", "TensorInfo", "disable_dropout",
           "export_symbol", "graph_to_json", "import_symbol", "place"]
