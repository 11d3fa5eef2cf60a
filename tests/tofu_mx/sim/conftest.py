import mxnet as mx
import pytest

from nnvm_passes import import_symbol


@pytest.fixture
def two_devices():
    """``(graph, device_of)``: data (4, 6) -> fc (3 outputs; weight 72 B, bias 12 B) on dev0
    -> relu -> sum -> MakeLoss on dev1, float32; ``device_of`` reads the ctx groups."""
    with mx.AttrScope(ctx_group="dev0"):
        fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    with mx.AttrScope(ctx_group="dev1"):
        loss = mx.sym.MakeLoss(mx.sym.sum(mx.sym.relu(fc, name="relu"), name="total"),
                               name="loss")
    graph = import_symbol(loss, data=(4, 6))
    return graph, lambda i: int(graph.nodes[i].ctx_group[3:])
