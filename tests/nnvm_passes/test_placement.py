"""nnvm_passes.placement: where MXNet runs each node."""
import mxnet as mx

from nnvm_passes.importer import import_symbol
from nnvm_passes.placement import placed_group


def test_an_untagged_operator_is_placed_with_its_first_input():
    """placed_group: a node's own ctx group, else (an operator) its first input's, following
    untagged operators back; ``default`` for an untagged operator reading nothing."""
    with mx.AttrScope(ctx_group="dev1"):
        a = mx.sym.relu(mx.sym.var("x"), name="a")
    b = mx.sym.exp(a, name="b")                     # untagged: runs with a
    c = mx.sym.elemwise_add(mx.sym.exp(b, name="c0"), a, name="c")
    g = import_symbol(mx.sym.Group([c, mx.sym.zeros((2,), name="z")]), x=(2,))
    assert [placed_group(g, g.index(n)) for n in ("a", "b", "c0", "c")] == ["dev1"] * 4
    assert placed_group(g, g.index("x")) == "dev1"       # the variable, tagged with a
    assert placed_group(g, g.index("z")) is None
    assert placed_group(g, g.index("z"), "dev0") == "dev0"
