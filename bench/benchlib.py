"""What every benchmark script writes: markdown tables, and files in bench/out/ (atomically)."""
from __future__ import annotations

import os
from typing import Iterable, Sequence

#: where the scripts write their tables and plots (bench/results/ keeps the runs quoted)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def table(head: Sequence, rows: Iterable[Sequence]) -> str:
    """A markdown table: ``head``'s cells, then each row's, as text."""
    lines = ["| " + " | ".join(map(str, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def write_out(name: str, text: str) -> str:
    """``text`` written to ``bench/out/<name>`` (through a temporary file, so a run stopped
    while writing leaves the last one whole); the path."""
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path
