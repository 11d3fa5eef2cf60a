"""The files a user names: checked before any long computation, read with an error that says
why not, written atomically (a reader sees the old file or the new one, never half of one)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Iterator

import mxnet as mx

from nnvm_passes.importer import symbol_json
from tofu_mx.arguments import is_int, show
from tofu_mx.errors import InvalidArgumentError, mxnet_message


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file in ``path``'s folder, then rename it over
    ``path``. The file gets the permissions ``open(path, "w")`` would give it (the umask
    applied), not ``mkstemp``'s 0600. On any error the temporary file is removed and
    ``path`` is left as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}.", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:     # on disk before the rename: a crash leaves old or new
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    """:func:`atomic_write` of ``data``."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)


def check_writable(path: str, what: str) -> str:
    """``path`` as given if :func:`atomic_write` can create or replace a file there: not a
    folder, not a device or pipe (which a rename would replace), in an existing folder where
    new files may be created. Else :class:`tofu_mx.InvalidArgumentError` naming ``what``
    (``"--json"``), the path and what to change. Checked before a long computation, so that
    its result is not lost; writing can still fail later (a full disk). ``os.PathLike`` is
    accepted; the path is returned as ``str``."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"{what} must be a path (str), got {type(path).__name__} "
                                   f"{show(path)}; e.g. 'model.params'")
    path = os.fspath(path)
    if not path:
        raise InvalidArgumentError(f"{what} is empty; give the path of a file to write")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidArgumentError(
            f"cannot write {what} {path!r}: it is a folder; give the path of a file")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise InvalidArgumentError(
            f"cannot write {what} {path!r}: it exists and is not a regular file (a device, a "
            f"pipe or a broken link), which writing would replace; give another path")
    if not os.path.isdir(folder):
        reason = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise InvalidArgumentError(f"cannot write {what} {path!r}: the folder {folder!r} "
                                   f"{reason}; create it first or give another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"cannot write {what} {path!r}: no permission to create "
                                   f"files in the folder {folder!r}; give another path")
    return path


def read_text(path: str, what: str, hint: str) -> str:
    """The text (UTF-8) of the regular file ``path``; else
    :class:`tofu_mx.InvalidArgumentError` naming ``what`` (``"symbol file"``), the path and
    why: missing, a folder, a device, no permission, not text. ``hint`` says what file is
    expected (``"a symbol JSON file saved by Symbol.save"``)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        folder = os.path.dirname(os.path.abspath(path))
        where = "" if os.path.isdir(folder) else f" (nor does its folder {folder!r})"
        raise InvalidArgumentError(f"{what} {path!r} does not exist{where}; give {hint}")
    if not os.path.isfile(path):
        kind = "a folder" if os.path.isdir(path) else "not a regular file"
        raise InvalidArgumentError(f"{what} {path!r} is {kind}; give {hint}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read {what} {path!r}: {e.strerror}; give {hint} "
                                   f"that you may read") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(
            f"{what} {path!r} is not text: byte {e.start} (0x{data[e.start]:02x}) is not "
            f"UTF-8; give {hint}") from e


# --- symbol files ------------------------------------------------------------------------------
SYMBOL_FILE_HINT = "a symbol JSON file as Symbol.save writes it (e.g. net-symbol.json)"
_UINT32 = 2 ** 32     # MXNet reads node ids, output indices and versions as uint32


def load_symbol(path: str) -> mx.sym.Symbol:
    """The Symbol saved in the JSON file ``path``, its graph checked before MXNet reads it:
    MXNet 1.9.1 crashes the process (a segmentation fault) on an input that names an output
    its node does not have, builds a cycle where an input names a later node, and answers a
    missing key with the parser's position. Raises :class:`tofu_mx.InvalidArgumentError`
    naming the file, the node (index, name, op) and what is wrong."""
    where = f"symbol file {os.fspath(path)!r}"
    text = read_text(path, "symbol file", SYMBOL_FILE_HINT)
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(f"{where} is not JSON: {e.msg} at line {e.lineno} column "
                                   f"{e.colno} (a truncated file?); give {SYMBOL_FILE_HINT}") \
            from e
    except RecursionError:
        raise InvalidArgumentError(f"{where} is nested too deeply to be a symbol; give "
                                   f"{SYMBOL_FILE_HINT}") from None
    _check_graph(graph, where)
    _check_output_indices(graph, where)
    # MXNet reads the graph as checked, not the text: a key written twice is read once here
    return _mxnet_load(json.dumps(graph, ensure_ascii=False), where)


def _mxnet_load(text: str, where: str) -> mx.sym.Symbol:
    try:
        return mx.sym.load_json(text)
    except mx.base.MXNetError as e:
        raise InvalidArgumentError(f"MXNet cannot load {where}: {mxnet_message(e)}; give "
                                   f"{SYMBOL_FILE_HINT}") from e


def _check_graph(graph: Any, where: str) -> None:
    """Keys, types and ranges of a symbol's JSON graph, then that it has no cycle."""
    if not isinstance(graph, dict):
        raise InvalidArgumentError(f"{where} holds a JSON {type(graph).__name__}, not a "
                                   f"symbol (an object with nodes, arg_nodes and heads); give "
                                   f"{SYMBOL_FILE_HINT}")
    for key in ("nodes", "arg_nodes", "heads"):
        if not isinstance(graph.get(key), list):
            got = "has none" if key not in graph else f"has a {type(graph[key]).__name__}"
            raise InvalidArgumentError(f"{where} is not a symbol: it needs a list {key!r} and "
                                       f"{got}; give {SYMBOL_FILE_HINT}")
    nodes = graph["nodes"]
    if not nodes or not graph["heads"]:
        raise InvalidArgumentError(f"{where} has no {'nodes' if not nodes else 'outputs'} "
                                   f"({'nodes' if not nodes else 'heads'} is empty); give "
                                   f"{SYMBOL_FILE_HINT}")
    first: dict[str, int] = {}
    for i, node in enumerate(nodes):
        _check_fields(node, i, where)
        if first.setdefault(node["name"], i) != i:
            raise InvalidArgumentError(
                f"{where}: {_describe(nodes, i)} has the name of node {first[node['name']]}; "
                f"MXNet binds variables and tofu_mx places operators by name: give each node "
                f"its own name")
    for i, node in enumerate(nodes):
        _check_inputs(nodes, i, where)
        for k, sub in enumerate(node.get("subgraphs") or []):
            _check_graph(sub, f"subgraph {k} of {_describe(nodes, i)} in {where}")
    for k, nid in enumerate(graph["arg_nodes"]):
        if not is_int(nid) or not 0 <= nid < len(nodes) or nodes[nid]["op"] != "null":
            what = f"names {_describe(nodes, nid)}" if is_int(nid) and 0 <= nid < len(nodes) \
                else f"names {_out_of_range(nid, nodes)}"
            raise InvalidArgumentError(f"{where}: arg_nodes[{k}] {what}; arg_nodes must list "
                                       f"variable nodes (op 'null') only")
    for k, entry in enumerate(graph["heads"]):
        _check_entry(nodes, entry, f"heads[{k}]", where)
    _check_acyclic(nodes, where)


def _check_fields(node: Any, i: int, where: str) -> None:
    if not isinstance(node, dict):
        raise InvalidArgumentError(f"{where}: node {i} is a JSON {type(node).__name__}, not "
                                   f"an object with op, name and inputs")
    for key, kind in (("op", str), ("name", str), ("inputs", list), ("control_deps", list),
                      ("subgraphs", list)):
        optional = key in ("control_deps", "subgraphs")
        if not isinstance(node.get(key, [] if optional else None), kind):
            got = "none" if key not in node else \
                f"{type(node[key]).__name__} {json.dumps(node[key])[:40]}"
            raise InvalidArgumentError(f"{where}: node {i} needs {key!r} ({kind.__name__}), "
                                       f"got {got}")
    for key in ("attrs", "attr", "param"):
        attrs = node.get(key, {})
        if not (isinstance(attrs, dict) and all(isinstance(v, str) for v in attrs.values())):
            raise InvalidArgumentError(f"{where}: node {i} {node['name']!r}: {key!r} must map "
                                       f"names to strings, got {json.dumps(attrs)[:60]}")


def _check_inputs(nodes: list, i: int, where: str) -> None:
    node = nodes[i]
    if node["op"] == "null" and node["inputs"]:
        raise InvalidArgumentError(f"{where}: {_describe(nodes, i)} has inputs; a variable "
                                   f"(op 'null') has none")
    for k, entry in enumerate(node["inputs"]):
        _check_entry(nodes, entry, f"input {k} of {_describe(nodes, i)}", where)
    for nid in node.get("control_deps", []):
        if not is_int(nid) or not 0 <= nid < len(nodes):
            raise InvalidArgumentError(f"{where}: control_deps of {_describe(nodes, i)} names "
                                       f"{_out_of_range(nid, nodes)}")


def _check_entry(nodes: list, entry: Any, what: str, where: str) -> None:
    """An output entry ``[node id, output index]`` or ``[node id, output index, version]``."""
    if not (isinstance(entry, list) and len(entry) in (2, 3) and all(map(is_int, entry))):
        raise InvalidArgumentError(f"{where}: {what} is {json.dumps(entry)[:40]}, not "
                                   f"[node id, output index, version] (integers)")
    nid, index = entry[0], entry[1]
    if not 0 <= nid < len(nodes):
        raise InvalidArgumentError(f"{where}: {what} names {_out_of_range(nid, nodes)}")
    if not (0 <= index < _UINT32 and 0 <= entry[-1] < _UINT32):
        raise InvalidArgumentError(f"{where}: {what} is {entry}: output index and version "
                                   f"must be between 0 and 2**32 - 1")
    if index > 0 and isinstance(nodes[nid], dict) and nodes[nid].get("op") == "null":
        raise InvalidArgumentError(f"{where}: {what} reads output {index} of "
                                   f"{_describe(nodes, nid)}, a variable, which has only "
                                   f"output 0")


def _check_acyclic(nodes: list, where: str) -> None:
    """No node depends on itself (through inputs and control_deps). Iterative depth-first
    search: a saved graph can be deeper than Python's recursion limit."""
    def deps(i: int) -> list[int]:
        return [e[0] for e in nodes[i]["inputs"]] + nodes[i].get("control_deps", [])
    state = [0] * len(nodes)            # 0 unseen, 1 on the current path, 2 done
    for root in range(len(nodes)):
        if state[root]:
            continue
        path, todo = [root], [iter(deps(root))]
        state[root] = 1
        while todo:
            nid = next(todo[-1], None)
            if nid is None:
                state[path.pop()] = 2
                todo.pop()
            elif state[nid] == 1:
                cycle = path[path.index(nid):] + [nid]
                raise InvalidArgumentError(
                    f"{where}: the graph has a cycle: "
                    f"{' reads '.join(_describe(nodes, n) for n in cycle)}; an "
                    f"input must name a node computed before it (fix the node ids in "
                    f"'inputs')")
            elif state[nid] == 0:
                state[nid] = 1
                path.append(nid)
                todo.append(iter(deps(nid)))


def _check_output_indices(graph: dict, where: str) -> None:
    """Each entry that reads output ``k > 0`` of an operator reads one the operator has. Only
    MXNet knows how many outputs an operator has (its op and attributes decide), and reading
    past them crashes it: so MXNet loads a copy whose entries all read output 0, with a node
    per such operator as an output, and reports each node's outputs in ``node_row_ptr``."""
    nodes = graph["nodes"]
    reads = [(e, what) for what, e in _entries(graph) if e[1] > 0]
    if not reads:
        return
    copy = dict(graph, nodes=[dict(n, name=f"n{i}", inputs=[[e[0], 0, 0] for e in n["inputs"]])
                              for i, n in enumerate(nodes)],
                heads=[[nid, 0, 0] for nid in dict.fromkeys(e[0] for e, _ in reads)])
    saved = json.loads(symbol_json(_mxnet_load(json.dumps(copy, ensure_ascii=False), where)))
    row_ptr = saved["node_row_ptr"]
    outputs = {n["name"]: row_ptr[i + 1] - row_ptr[i] for i, n in enumerate(saved["nodes"])}
    for entry, what in reads:
        count = outputs[f"n{entry[0]}"]
        if entry[1] >= count:
            raise InvalidArgumentError(
                f"{where}: {what} reads output {entry[1]} of {_describe(nodes, entry[0])}, "
                f"which has {count} output{'s' if count != 1 else ''} (0..{count - 1})")


def _entries(graph: dict) -> Iterator[tuple[str, list]]:
    nodes = graph["nodes"]
    for i, node in enumerate(nodes):
        for k, entry in enumerate(node["inputs"]):
            yield f"input {k} of {_describe(nodes, i)}", entry
    for k, entry in enumerate(graph["heads"]):
        yield f"heads[{k}]", entry


def _describe(nodes: list, i: int) -> str:
    node = nodes[i]
    return f"node {i} {node['name']!r} ({'variable' if node['op'] == 'null' else node['op']})"


def _out_of_range(nid: Any, nodes: list) -> str:
    return f"node {json.dumps(nid)[:20]}, and the graph has nodes 0..{len(nodes) - 1}"


