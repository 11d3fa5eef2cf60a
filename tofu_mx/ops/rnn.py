"""Fused recurrent operators."""
from tofu_mx.tdl import opaque

# MXNet's fused RNN op runs a whole multi-layer recurrence over time inside one kernel, with
# all weights packed in one flat parameter vector; its value at step t depends on every
# earlier step, which TDL (no loops, no recursion) cannot express. Its batch axis is
# independent: data (T, N, C) and the states (L, N, H) split on N, the packed parameters are
# needed whole. Unrolled cells (tofu_mx.models.rnn) are described op by op instead. It is
# never run again for the backward pass: its dropout between layers (p > 0) is random, and
# its gradient reads the state its forward run saved.
opaque("RNN", "a recurrence over time inside one kernel; weights packed in one vector",
       batch_axes=(1, None, 1, 1, None), output_batch_axes=(1, 1, 1), recompute=False)
