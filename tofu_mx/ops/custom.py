"""MXNet's Python custom operators (``mx.sym.Custom``). Each ``op_type`` is described on its
own, as ``"Custom:<op_type>"``; what holds for all of them is declared here."""
from tofu_mx.tdl.registry import kind_facts

# MXNet passes every node attribute to the CustomOpProp constructor, __ctx_group__ included,
# and a Prop whose __init__ takes no keywords (MXNet's own examples) raises there and the
# process dies: place these nodes through their first input instead.
kind_facts("Custom", group_attr=False, recompute=False)
