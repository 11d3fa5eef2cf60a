"""Train an LSTM language model, partitioned over several devices by tofu_mx, on the Python
standard library's own source code (next-character prediction).

The model is a Gluon HybridBlock: Embedding, --layers gluon.rnn.LSTMCell unrolled over --steps
time steps (zero initial state), and a Dense decoder at every step; Gluon's
SoftmaxCrossEntropyLoss averages over the steps. Each cell is unrolled rather than Gluon's
fused rnn.LSTM, whose single RNN operator is opaque to the partitioner (it could only be
split by batch): unrolled, every operator partitions (no fallback), as in the paper's RNN
(tofu_mx.models.rnn). The vocabulary is the --vocab - 1 most frequent characters of the
interpreter's standard-library *.py files, plus one id for every other character; the text
has a few hundred distinct characters, so a larger --vocab sizes the embedding and the
decoder as a word-level model's would, with ids the text never uses.

Small, on CPU devices:
    python examples/train_rnn.py --devices cpu:2 --compare --dtype float64
At the paper's sizes (10 layers, hidden 8192, 20 steps, vocabulary 10000) over 8 GPUs:
    python examples/train_rnn.py --devices gpu:8 --layers 10 --hidden 8192 --steps 20 \\
        --vocab 10000 --batch-size 64 --steps-total 100 --init shards
"""
from __future__ import annotations

import sys

import common
import data
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn, rnn


class LanguageModel(gluon.HybridBlock):
    """(batch, steps) token ids -> (batch, steps, vocab) next-token logits."""

    def __init__(self, vocab: int, hidden: int, layers: int, steps: int, **kwargs):
        super().__init__(**kwargs)
        self.steps = steps
        with self.name_scope():
            self.embed = nn.Embedding(vocab, hidden)
            self.cells = nn.HybridSequential()     # a container: called one by one below
            for _ in range(layers):
                self.cells.add(rnn.LSTMCell(hidden, input_size=hidden))
            self.decoder = nn.Dense(vocab, flatten=False, in_units=hidden)

    def hybrid_forward(self, F, tokens):
        x = self.embed(tokens)
        # the zero initial state (batch, hidden), made from the input so no shape is written
        zeros = F.zeros_like(F.sum(x, axis=1))
        for cell in self.cells:
            x, _ = cell.unroll(self.steps, x, begin_state=[zeros, zeros], layout="NTC",
                               merge_outputs=True)
        return self.decoder(x)


def build_task(args) -> common.Task:
    text = data.Text(args.batch_size, args.steps, args.vocab, args.seed, args.dtype)
    return common.Task(
        name="train_rnn",
        title=f"LSTM LM, {args.layers} x {args.hidden}, {args.steps} steps, vocab {args.vocab}",
        make_net=lambda: LanguageModel(args.vocab, args.hidden, args.layers, args.steps,
                                       prefix="lm_"),
        init=mx.init.Xavier(), loss=gluon.loss.SoftmaxCrossEntropyLoss(), data=text,
        config=dict(layers=args.layers, hidden=args.hidden, steps=args.steps, vocab=args.vocab))


def main(argv=None) -> int:
    p = common.parser(__doc__, batch_size=8, lr=0.1)
    p.add_argument("--layers", type=common.positive_int, default=2)
    p.add_argument("--hidden", type=common.positive_int, default=64)
    p.add_argument("--steps", type=common.positive_int, default=8,
                   help="sequence length: time steps unrolled (BPTT)")
    p.add_argument("--vocab", type=common.int_at_least(2), default=64,
                   help="ids: the --vocab - 1 most frequent characters, one for the rest")
    return common.run(p, build_task, argv)


if __name__ == "__main__":
    sys.exit(main())
