"""The built-in operator descriptions, one module per family. Importing this package
registers them all (explicitly, in this order)."""
from tofu_mx.ops import (attention, conv, creation, custom, elemwise,  # noqa: F401
                         indexing, layout, linalg, loss, math, nn, norm, reduce, rnn,
                         sequence, shape)
