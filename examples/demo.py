"""tofu_mx demo (``make demo``): partition models over CPU devices with tofu_mx.partition(),
prove each result with tofu_mx.verify(), then summarise and plan the paper's models at the
paper's sizes.

CPU devices ``mx.cpu(0..k-1)`` stand in for GPUs: the partitioned Symbol binds on
``mx.gpu(i)`` unchanged. About 15 s on 2 cores.
"""
import os
import time

# MXNet logs one line per executor bound ("Subgraph backend MKLDNN is activated"); verify()
# binds many. Only the log is silenced.
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import mxnet as mx  # noqa: E402

import tofu_mx  # noqa: E402
from nnvm_passes import import_symbol  # noqa: E402
from tofu_mx import models  # noqa: E402
from tofu_mx.search.baselines import baseline_plan  # noqa: E402
from tofu_mx.search.plan import lower_graph  # noqa: E402
from tofu_mx.summary import format_bytes  # noqa: E402
from tofu_mx.tdl.annotate import import_graph  # noqa: E402


def partition_and_verify(title, symbol, shapes, k, dtypes=None, rows=0):
    """partition() over cpu(0..k-1), then verify() against the unpartitioned graph on cpu(0)
    at verify's default tolerance (rtol 1e-4, atol 1e-5)."""
    ctx = [mx.cpu(i) for i in range(k)]
    start = time.perf_counter()
    ptd = tofu_mx.partition(symbol, ctx, dtypes=dtypes, **shapes)
    took = time.perf_counter() - start
    print(f"\n== {title}: partitioned over cpu(0..{k - 1}) in {took:.1f} s "
          f"(cuts {' x '.join(map(str, ptd.plan.factors))}, "
          f"{format_bytes(ptd.plan.total_bytes)} moved per step)")
    if rows:
        print(ptd.report(max_rows=rows))
    start = time.perf_counter()
    report = tofu_mx.verify(symbol, ptd, ctx, dtypes=dtypes, **shapes)   # raises if not equal
    print(f"verify(): {len(report.comparisons)} tensors (outputs, every gradient, aux states) "
          f"agree with cpu(0) alone, in {time.perf_counter() - start:.1f} s; worst: "
          f"{report.worst.describe()}")


def summarise(title, symbol, shapes):
    start = time.perf_counter()
    graph = import_symbol(symbol, **shapes)
    took = time.perf_counter() - start
    print(f"\n== {title}  ({len(graph.nodes)} nodes, imported with shapes in {took:.2f} s)")
    print(tofu_mx.summarize(graph))


def paper_plan(symbol, shapes, k=8):
    """The plan tofu_mx.plan() makes (on the graph it searches: imported, BatchNorm lowered),
    the seconds the search took, and the data-parallel baseline's bytes on the same graph."""
    graph = lower_graph(import_graph(symbol, **shapes), k)
    start = time.perf_counter()
    plan = tofu_mx.search.plan_graph(graph, k)
    took = time.perf_counter() - start
    return plan, took, baseline_plan(graph, k, "data_parallel").total_bytes


def plan_at_paper_size(title, symbol, shapes, k=8):
    plan, took, dp = paper_plan(symbol, shapes, k)
    print(f"\n{title}: searched in {took:.2f} s; moves {format_bytes(plan.total_bytes)} per "
          f"step, data parallelism {format_bytes(dp)} ({dp / plan.total_bytes:.1f}x more)")
    report = plan.report(max_rows=0).splitlines()
    print("\n".join(report[:next(i for i, line in enumerate(report) if "tensors" in line)]))


def main():
    # WResNet in float64, so that one device and four agree whatever the summation order.
    shapes = models.input_shapes("wresnet", 8, image_size=64)
    partition_and_verify("WResNet-26, widen 1, 64x64, batch 8",
                         models.wresnet(26, widen=1, num_classes=10), shapes, 4,
                         dtypes={name: "float64" for name in shapes}, rows=6)
    # Any device count: 3 and 6 = 3 x 2 (float32: Embedding computes in float32).
    for k in (3, 6):
        partition_and_verify("LSTM LM, 2 x 96, 5 steps, batch 6", models.rnn(2, 96, 5, 300),
                             models.input_shapes("rnn", 6, seq_len=5), k)

    print("\n\nThe paper's models at the paper's sizes (symbols only: nothing is allocated).")
    summarise("WResNet-152, widen 10, batch 8, 224x224", models.wresnet(152, 10),
              models.input_shapes("wresnet", 8))
    summarise("LSTM LM, 10 layers, hidden 8192, 20 steps, vocab 10000, batch 8",
              models.rnn(10, 8192, 20, 10000), models.input_shapes("rnn", 8, seq_len=20))
    summarise("Transformer encoder, 12 layers, 1024 units, 16 heads, 128 tokens, batch 8",
              models.transformer(12, 1024, 16, 128, 30000),
              models.input_shapes("transformer", 8, seq_len=128))

    print("\n\n== plan(): the search alone, 8 devices, against data parallelism "
          "(same cost model)")
    plan_at_paper_size("WResNet-152-W10, batch 32", models.wresnet(152, 10),
                       models.input_shapes("wresnet", 32))
    plan_at_paper_size("LSTM 10 x 8192, 20 steps, batch 64", models.rnn(10, 8192, 20, 10000),
                       models.input_shapes("rnn", 64, seq_len=20))


if __name__ == "__main__":
    main()
