"""DOT dumps of a graph at each stage: `forward`, `backward`, `optimised`.

    gc.to_dot(graph_or_tensors_or_executable, path=None, stage=None) -> str

* `forward`: the nodes a user built (inputs, params, constants, forward ops).
* `backward`: the same plus the nodes the differentiation pass added, drawn
  in two clusters, so the reader sees which forward values the backward
  reads.
* `optimised` (an executable from `gc.compile`): its optimised graph, forward
  and backward clusters again, each fusion group a nested cluster named after
  its kernel, and every captured forward value (kept alive from the forward
  into the backward) drawn as a highlighted edge labelled with its size; a
  forward value recomputed in the backward under a memory budget (`remat`)
  is drawn octagonal, labelled "recomputed".

The structure is built with pydot, never by pasting strings, and node ids are
our own (`n<id>`), so a user's name only ever reaches the DOT text inside a
quoted attribute value. Those values are quoted here rather than by pydot,
because pydot passes a value that already looks quoted (`"x"`) or like an
HTML label (`<b>`) through verbatim, and leaves a trailing backslash to
escape the closing quote; a name is arbitrary text and must come out as text.

Rendering to `.svg`/`.png`/`.pdf` runs Graphviz's `dot` program. Where it is
not installed the `.dot` file is still written beside the requested path and
a `GraphvizMissingWarning` says how to install Graphviz.
"""

from __future__ import annotations

import reprlib
import shutil
import subprocess
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import BackendUnavailableError
from .frontend.tensor import Tensor
from .ir import Graph, Node
from .ops.custom import CustomGradient
from .units import format_bytes

STAGES = ("forward", "backward", "optimised")
RENDERED_FORMATS = ("svg", "png", "pdf")

_ROLE_STYLE = {
    "input": {"shape": "box", "style": "filled", "fillcolor": "lightblue"},
    "param": {"shape": "box", "style": "filled", "fillcolor": "khaki"},
    "const": {"shape": "box", "style": "rounded", "color": "grey40", "fontcolor": "grey30"},
    "forward": {"shape": "ellipse"},
    "backward": {"shape": "ellipse", "style": "filled", "fillcolor": "mistyrose"},
}
_CAPTURE_EDGE = {"color": "red", "penwidth": "2.5", "fontcolor": "red"}
_MAX_PARAM_TEXT = 48


class GraphvizMissingWarning(UserWarning):
    """The `dot` program is not installed, so only the `.dot` file was written."""


def quote(text: str) -> str:
    """`text` as a DOT quoted string that Graphviz shows literally.

    Inside quotes DOT unescapes only `\\"`; labels then read `\\\\` as one
    backslash and `\\n` as a line break, so backslashes are doubled first.
    """
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "\\n")
    )
    return f'"{escaped}"'


def to_dot(obj: Any, path: str | Path | None = None, stage: str | None = None) -> str:
    """The DOT text of `obj` at `stage`; with `path`, also write or render it.

    `obj` is a `Graph`, a `Tensor` or list of Tensors (drawn with everything
    they depend on, marked as outputs), or a compiled executable. `stage`
    defaults to `optimised` for an executable, to `backward` for a graph
    that has backward nodes and to `forward` for one that has none.
    """
    stage = stage or _default_stage(obj)
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
    text = _build(obj, stage).to_string()
    if path is not None:
        write(text, Path(path))
    return text


def write(text: str, path: Path) -> None:
    """Write DOT `text` to a `.dot` path, or render it by the path's suffix."""
    fmt = path.suffix.lstrip(".").lower()
    if fmt in ("dot", "gv"):
        path.write_text(text, encoding="utf-8")
        return
    if fmt not in RENDERED_FORMATS:
        raise ValueError(
            f"cannot write a graph to '{path}': use a .dot path, or one of "
            f"{', '.join('.' + f for f in RENDERED_FORMATS)} to render it with Graphviz")
    program = shutil.which("dot")
    if program is None:
        beside = path.with_suffix(".dot")
        beside.write_text(text, encoding="utf-8")
        warnings.warn(
            f"Graphviz's `dot` program is not installed, so '{path}' was not rendered; the graph "
            f"was written to '{beside}'. Install Graphviz (apt-get install graphviz, brew install "
            f"graphviz or conda install graphviz), or render it later with "
            f"`dot -T{fmt} {beside} -o {path}`.",
            GraphvizMissingWarning, stacklevel=3)
        return
    done = subprocess.run([program, f"-T{fmt}", "-o", str(path)], input=text.encode("utf-8"),
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Graphviz could not render '{path}': "
                           f"{done.stderr.decode('utf-8', 'replace').strip()}")


# -- what to draw ------------------------------------------------------------------------------

def is_executable(obj: Any) -> bool:
    return hasattr(obj, "plan") and isinstance(getattr(obj, "graph", None), Graph)


def not_drawable(obj: Any) -> str | None:
    """What `obj` is, in words, if `to_dot` cannot draw it (None if it can): the command
    line names it when a user's build function returns something else."""
    if isinstance(obj, (Graph, Tensor)) or is_executable(obj):
        return None
    if not isinstance(obj, (list, tuple)):
        return _what(obj)
    if not obj:
        return f"an empty {type(obj).__name__}"
    stray = next((k for k, item in enumerate(obj) if not isinstance(item, Tensor)), None)
    if stray is None:
        return None
    return f"a {type(obj).__name__} whose item {stray} is {_what(obj[stray])}"


def _what(value: Any) -> str:
    return "None" if value is None else f"{reprlib.repr(value)} (of type {type(value).__name__})"


def _default_stage(obj: Any) -> str:
    if is_executable(obj):
        return "optimised"
    graph, _ = _graph_and_outputs(obj)
    return "backward" if any(side(n) == "backward" for n in graph.nodes.values()) else "forward"


def _graph_and_outputs(obj: Any) -> tuple[Graph, list[int]]:
    if isinstance(obj, Graph):
        return obj, list(obj.outputs)
    if is_executable(obj):
        return obj.graph, list(obj.graph.outputs)
    problem = not_drawable(obj)
    if problem is not None:
        raise TypeError("to_dot takes a Graph, a Tensor, a list of Tensors or a compiled executable, "
                        f"not {problem}")
    tensors = [obj] if isinstance(obj, Tensor) else list(obj)
    graphs = {id(t.graph) for t in tensors}
    if len(graphs) != 1:
        raise ValueError("to_dot: the tensors come from different graphs")
    return tensors[0].graph, [t.id for t in tensors]


def side(node: Node) -> str:
    """`backward` for nodes the differentiation pass built, `forward` otherwise.

    Constants take the role `const` wherever they are built; the pass marks
    the ones it builds with the forward node they serve (`origin`).
    """
    if node.role == "backward" or (node.role == "const" and node.origin is not None):
        return "backward"
    return "forward"


def composite_of(graph: Graph, node: Node) -> str | None:
    """The custom-gradient composite a node belongs to, as its cluster label: the forward
    nodes its function built, and the backward nodes its user's backward built."""
    if node.id in graph.scopes:
        return f"custom_gradient {graph.scopes[node.id]}"
    if node.origin is not None and node.origin in graph and node.role == "backward":
        origin = graph[node.origin].op
        if isinstance(origin, CustomGradient):
            return f"custom_gradient {origin.label_name} (backward)"
    return None


def _pydot():
    try:
        import pydot
    except ImportError:  # pragma: no cover - pydot ships with the test and viz extras
        raise BackendUnavailableError(
            "DOT dumps need pydot: pip install 'gradcompiler[viz]'") from None
    return pydot


def _build(obj: Any, stage: str):
    if stage == "optimised" and not is_executable(obj):
        raise ValueError("stage 'optimised' needs a compiled executable (gc.compile(...)); "
                         "a graph or tensors can be drawn at stage 'forward' or 'backward'")
    graph, outputs = _graph_and_outputs(obj)
    ids = graph.ancestors(outputs) if outputs else set(graph.nodes)
    if stage == "forward":
        ids = {i for i in ids if side(graph[i]) == "forward"}
    pydot = _pydot()
    dot = pydot.Dot(graph_type="digraph", label=quote(f"{graph.name} ({stage})"),
                    labelloc="t", compound="true")
    dot.set_node_defaults(fontname="Helvetica", fontsize="10")
    dot.set_edge_defaults(fontname="Helvetica", fontsize="9")
    clusters = {s: pydot.Cluster(s, label=quote(s), style="dashed", color="grey50")
                for s in ("forward", "backward")}
    if stage == "optimised":
        remat = obj.context.remat
        _add_fusion_groups(pydot, clusters, graph, obj.plan, ids, set(outputs),
                           set(remat.clones) if remat is not None else set())
    else:
        composites: dict[tuple[str, str], object] = {}
        for i in sorted(ids):
            node, where = graph[i], side(graph[i])
            label = composite_of(graph, node)
            parent = clusters[where]
            if label is not None:
                if (where, label) not in composites:
                    composites[where, label] = pydot.Cluster(
                        f"{where}_composite_{len(composites)}", label=quote(label),
                        style="rounded", color="darkorange")
                    parent.add_subgraph(composites[where, label])
                parent = composites[where, label]
            parent.add_node(_node(pydot, node, i in outputs))
    for cluster in clusters.values():
        if cluster.get_nodes() or cluster.get_subgraphs():
            dot.add_subgraph(cluster)
    captures = _captures(obj) if stage == "optimised" else {}
    _add_edges(pydot, dot, graph, ids, captures)
    return dot


def _add_fusion_groups(pydot, clusters, graph: Graph, plan, ids: set[int], outputs: set[int],
                       recomputed: set[int]):
    """Kernels as clusters inside the side they run on; sources and aliases stay plain nodes."""
    grouped: set[int] = set()
    kernels = {id(group) for group in plan.kernels()}
    for index, group in enumerate(plan.groups):
        members = [i for i in group.nodes if i in ids]
        if id(group) not in kernels or not members:
            continue
        sides = {side(graph[i]) for i in members}
        owner = "backward" if "backward" in sides else "forward"
        cluster = pydot.Cluster(f"k{index}", label=quote(f"{group.name} ({group.kind})"),
                                style="rounded,filled", fillcolor="grey95", color="steelblue")
        materialised = set(group.outputs)
        for i in members:
            node = _node(pydot, graph[i], i in outputs)
            if i in recomputed:
                node.set("shape", "octagon")
                node.set("xlabel", quote("recomputed"))
            if i not in materialised:  # lives in registers only, never in memory
                node.set("style", ",".join(filter(None, (node.get("style"), "dashed"))))
            cluster.add_node(node)
        clusters[owner].add_subgraph(cluster)
        grouped.update(members)
    for i in sorted(ids - grouped):
        clusters[side(graph[i])].add_node(_node(pydot, graph[i], i in outputs))


def _captures(executable: Any) -> dict[int, int]:
    """Captured node id → bytes kept alive, from the executable's memory plan."""
    return {int(node): int(nbytes) for node, _shape, _dtype, nbytes in executable.context.memory.captures}


def _add_edges(pydot, dot, graph: Graph, ids: set[int], captures: dict[int, int]) -> None:
    for i in sorted(ids):
        node = graph[i]
        for slot, source in enumerate(node.inputs):
            if source not in ids:
                continue
            attrs: dict[str, str] = {}
            if len(node.inputs) > 1:
                attrs["taillabel"] = quote(str(slot))
            if source in captures and side(node) == "backward":
                attrs.update(_CAPTURE_EDGE, label=quote(f"capture {format_bytes(captures[source])}"))
            dot.add_edge(pydot.Edge(f"n{source}", f"n{i}", **attrs))


# -- how a node reads ----------------------------------------------------------------------------

def node_label(node: Node) -> str:
    """Lines: the user's name (if any), the op and its parameters, the type."""
    lines = [f"%{node.id} '{node.name}'" if node.name else f"%{node.id}"]
    params = ", ".join(f"{k}={_short(v)}" for k, v in _shown_params(node))
    op = node.op.label if node.role not in ("input", "param") else f"{node.op.label} ({node.role})"
    lines.append(f"{op}({params})" if params else op)
    lines.append(str(node.type))
    return "\n".join(lines)


def _shown_params(node: Node) -> Iterable[tuple[str, Any]]:
    """Op parameters not already said by another line of the label (name, mode, type)."""
    said = {node.name, node.type.shape, node.type.dtype}
    for key, value in node.op.params().items():
        if key == "mode" and str(value) in node.op.label:
            continue
        try:
            if value in said:
                continue
        except TypeError:  # an unhashable parameter cannot repeat another line
            pass
        yield key, value


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= _MAX_PARAM_TEXT else text[: _MAX_PARAM_TEXT - 3] + "..."


def _node(pydot, node: Node, is_output: bool):
    attrs = dict(_ROLE_STYLE[node.role], label=quote(node_label(node)))
    if is_output:
        attrs.update(peripheries="2", penwidth="1.5")
    return pydot.Node(f"n{node.id}", **attrs)
