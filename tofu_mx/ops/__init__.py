"""The built-in operator descriptions, one module per family. Importing this package
registers them all (explicitly, in this order)."""
from tofu_mx.ops import conv, elemwise, linalg, loss, norm, reduce, rnn, sequence, shape  # noqa: F401
