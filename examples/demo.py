"""tofu_mx demo: import the paper's models and summarise them, search partition plans for
them, then prove a multi-device graph correct with verify().

Until the rewrite lands (issue 5), the multi-device graph run here is a hand placement: each
WResNet stage on its own CPU device. Run with `make demo`.
"""
import time

import mxnet as mx

from nnvm_passes import import_symbol

import tofu_mx
from tofu_mx import models


def show(title, symbol, shapes):
    start = time.perf_counter()
    graph = import_symbol(symbol, **shapes)
    took = time.perf_counter() - start
    print(f"\n== {title}  ({len(graph.nodes)} nodes, imported with shapes in {took:.2f} s)")
    print(tofu_mx.summarize(graph))


def main():
    print("The paper's models at the paper's sizes (symbols only: nothing is allocated).")
    show("WResNet-152, widen 10, batch 8, 224x224", models.wresnet(152, 10),
         models.input_shapes("wresnet", 8))
    show("LSTM LM, 10 layers, hidden 8192, 20 steps, vocab 10000, batch 8",
         models.rnn(10, 8192, 20, 10000), models.input_shapes("rnn", 8, seq_len=20))
    show("Transformer encoder, 12 layers, 1024 units, 16 heads, 128 tokens, batch 8",
         models.transformer(12, 1024, 16, 128, 30000), models.input_shapes("transformer", 8,
                                                                           seq_len=128))

    print("\n== plan(): the search, 8 devices (cuts 2 x 2 x 2), against data parallelism")
    from tofu_mx.search.baselines import baseline_plan
    for title, symbol, shapes in [
            ("WResNet-152-W10, batch 32", models.wresnet(152, 10), models.input_shapes("wresnet", 32)),
            ("LSTM 10 x 8192, 20 steps, batch 64", models.rnn(10, 8192, 20, 10000),
             models.input_shapes("rnn", 64, seq_len=20))]:
        graph = import_symbol(symbol, **shapes)
        start = time.perf_counter()
        plan = tofu_mx.search.plan_graph(graph, 8)
        took = time.perf_counter() - start
        dp = baseline_plan(graph, 8, "data_parallel").total_bytes
        print(f"{title}: searched in {took:.2f} s; moves "
              f"{tofu_mx.summary.format_bytes(plan.total_bytes)} per step, data parallelism "
              f"{tofu_mx.summary.format_bytes(dp)} ({dp / plan.total_bytes:.1f}x more)")
        print("\n".join(plan.report(max_rows=5).splitlines()[:9]))

    print("\n== partition(): WResNet-26 (widen 2, 64x64, batch 8) over cpu(0..3), verified "
          "against cpu(0)")
    symbol = models.wresnet(26, widen=2, num_classes=10)
    shapes = models.input_shapes("wresnet", 8, image_size=64)
    ctx = [mx.cpu(i) for i in range(4)]
    start = time.perf_counter()
    ptd = tofu_mx.partition(symbol, ctx, **shapes)
    print(f"partitioned in {time.perf_counter() - start:.1f} s")
    print(ptd.report(max_rows=8))
    start = time.perf_counter()
    report = tofu_mx.verify(symbol, ptd, ctx, rtol=1e-4, atol=1e-4, **shapes)
    print(f"{len(report.comparisons)} tensors (outputs, every gradient, aux states) compared in "
          f"{time.perf_counter() - start:.1f} s; worst: {report.worst.describe()}")
    print(str(report).splitlines()[-1])


if __name__ == "__main__":
    main()
