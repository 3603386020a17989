"""``plait graph``: a pipeline's call graph as Mermaid, DOT or an HTML page, without a call.

The graph is what the tracer records for one sample input: every leaf-module call
becomes a node labelled with its module path and kind, and every value it takes
from another call becomes an edge.  Tracing runs ``forward()`` with placeholders
instead of replies, so nothing is sent to any endpoint and no key is needed.

Operations on outputs (``out["key"]``, ``out.upper()``, slices) are nodes of their
own in the trace.  ``--ops shown`` (the default) draws them as dashed hexagons
between the calls; ``--ops collapsed`` leaves them out and joins each call
directly to the calls it waits on through them.
"""

from __future__ import annotations

import argparse
import html
import inspect
import sys
from pathlib import Path

from plait._signature import forward_shape
from plait.cli.options import parse_target_args, target_parser
from plait.inputs import FORMATS, InputError, Item, first_item, open_inputs
from plait.module import Module
from plait.resources.config import ConfigurationError
from plait.target import Target, TargetError
from plait.tracing.graph import Graph, Node, NodeRef, references
from plait.tracing.tracer import TracingError, trace

__all__ = ["build_parser", "dot", "html_page", "main", "mermaid", "svg"]


DESCRIPTION = """\
Trace TARGET on one sample input and print its call graph: no model is called.

The sample is --input TEXT, or the first input of --input FILE (or - for stdin),
read as `plait run` reads inputs; without --input each required parameter of
forward() gets a placeholder ("<name>").  Nodes are labelled with their module
path and kind; ops (indexing, attribute and method calls on outputs) are drawn
dashed, or left out with --ops collapsed.  --html FILE also writes a page with
the graph drawn as inline SVG (it works offline: no script, nothing fetched), the
Mermaid source and the DOT.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = target_parser("graph", "plait graph TARGET [key=value ...] [options]", DESCRIPTION)
    parser.add_argument(
        "-i", "--input", metavar="TEXT|FILE", help="sample input, or a file whose first one to use"
    )
    parser.add_argument(
        "--input-format", choices=FORMATS, default="auto", help="format of an --input file"
    )
    parser.add_argument("--field", metavar="NAME", help="pass this field of the input object")
    parser.add_argument(
        "--format", choices=("mermaid", "dot", "both"), default="both", help="what to print"
    )
    parser.add_argument(
        "--ops", choices=("shown", "collapsed"), default="shown", help="draw ops, or skip them"
    )
    parser.add_argument("--html", metavar="FILE", help="also write an HTML page with the graph")
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def _error(message: str, status: int = 2) -> int:
    print(f"plait graph: error: {message}", file=sys.stderr)
    return status


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns = parse_target_args(parser, argv)
    if isinstance(ns, int):
        return ns
    try:
        module = Target(ns.target, ns.assignments).make()
        item = _sample(module, ns)
    except (TargetError, InputError, ConfigurationError) as exc:
        return _error(str(exc))
    if item.problem is not None:
        return _error(item.problem)
    try:
        graph = trace(module, item.args, item.kwargs)
    except TracingError as exc:
        return _error(f"tracing {ns.target} failed: {exc}", 1)
    except Exception as exc:
        return _error(f"tracing {ns.target} failed: {type(exc).__name__}: {exc}", 1)
    collapse = ns.ops == "collapsed"
    title = f"{ns.target} ({type(module).__name__})"
    chart, digraph = mermaid(graph, collapse, title), dot(graph, collapse)
    if ns.format in ("mermaid", "both"):
        print(chart)
    if ns.format == "both":
        print()
    if ns.format in ("dot", "both"):
        print(f"// plait graph: {title}\n{digraph}")
    if ns.html:
        page = html_page(title, chart, digraph, graph.describe(), svg(graph, collapse))
        target = Path(ns.html)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(page, encoding="utf-8")
        print(f"plait graph: wrote {target}", file=sys.stderr)
    return 0


def _sample(module: Module, ns: argparse.Namespace) -> Item:
    """The input to trace with: the text given, a file's first input, or placeholders."""
    text: str | None = ns.input
    if text is not None and (text == "-" or Path(text).is_file() or Path(text).is_dir()):
        source = open_inputs(text, ns.input_format, ns.field, module.forward)
        try:
            found = first_item(source)
        finally:
            source.close()
        if found is None:
            raise InputError(f"{text} has no inputs to trace with")
        return found
    if text is not None:
        return Item(text, (text,))
    args: list[str] = []
    kwargs: dict[str, str] = {}
    for param in forward_shape(type(module)).parameters:
        if param.default is not inspect.Parameter.empty:
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            args.append(f"<{param.name}>")
        elif param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            kwargs[param.name] = f"<{param.name}>"
    return Item(kwargs or (args[0] if len(args) == 1 else args), tuple(args), kwargs)


# -- the picture --------------------------------------------------------------------------------
class _View:
    """Which nodes to draw and which edges join them, with or without the ops."""

    def __init__(self, graph: Graph, collapse: bool) -> None:
        self.graph = graph

        # Composite calls' enter/exit nodes are structure, never drawn: edges look through them.
        def drawn(node: Node) -> bool:
            return node.kind == "module" or (node.kind == "op" and not collapse)

        self.nodes = [n for n in graph.nodes if drawn(n)]
        self.edges: list[tuple[int, int]] = []
        self.sources: list[int] = []
        for node in self.nodes:
            deps = graph.deps_through(node.id, drawn)
            if not deps:
                self.sources.append(node.id)
            self.edges += [(dep, node.id) for dep in deps]
        outputs: list[int] = []
        for ref in (r.node for r in references(graph.output) if isinstance(r, NodeRef)):
            node = graph.nodes[ref]
            outputs += [ref] if drawn(node) else graph.deps_through(ref, drawn)
        self.outputs = sorted(set(outputs))


def _caption(node: Node) -> tuple[str, str]:
    if node.kind != "module" or node.module is None:
        return node.path, "op"
    kind = type(node.module).__name__
    alias = getattr(node.module, "alias", None) if node.module._calls_llm else None
    return node.path, f"{kind} · module" + (f" · alias {alias}" if alias else "")


def _mermaid_text(text: str) -> str:
    return (
        text.replace("#", "#35;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
    )


def mermaid(graph: Graph, collapse: bool = False, title: str | None = None) -> str:
    view = _View(graph, collapse)
    lines = ["flowchart TD"]
    if title:  # after the header: some renderers want the diagram type on the first line
        lines.append(f"  %% plait graph: {title}")
    lines.append('  input(["input"])')
    for node in view.nodes:
        path, kind = (_mermaid_text(part) for part in _caption(node))
        label = f'"{path}<br/><small>{kind}</small>"'
        if node.kind == "module":
            lines.append(f"  n{node.id}[{label}]")
        else:
            lines.append(f"  n{node.id}{{{{{label}}}}}:::op")
    lines.append('  output(["output"])')
    lines += [f"  input --> n{node}" for node in view.sources]
    lines += [f"  n{a} --> n{b}" for a, b in view.edges]
    lines += [f"  n{node} --> output" for node in view.outputs]
    lines.append("  classDef op stroke-dasharray: 4 3,font-style:italic")
    return "\n".join(lines)


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def dot(graph: Graph, collapse: bool = False) -> str:
    view = _View(graph, collapse)
    lines = [
        "digraph plait {",
        "  rankdir=TB;",
        '  node [shape=box, style=rounded, fontname="Helvetica"];',
        "  input [shape=oval];",
        "  output [shape=oval];",
    ]
    for node in view.nodes:
        path, kind = (_dot_text(part) for part in _caption(node))
        style = "" if node.kind == "module" else ", shape=hexagon, style=dashed"
        lines.append(f'  n{node.id} [label="{path}\\n{kind}"{style}];')
    lines += [f"  input -> n{node};" for node in view.sources]
    lines += [f"  n{a} -> n{b};" for a, b in view.edges]
    lines += [f"  n{node} -> output;" for node in view.outputs]
    lines.append("}")
    return "\n".join(lines)


# -- an SVG drawn here, so the HTML page needs no script and no network ----------------------
_FONT_PX = 13
_CHAR_PX = 7.4  # the average advance of a 13 px sans-serif character, a little generous
_BOX_H = 46
_GAP_X = 28
_GAP_Y = 56
_MARGIN = 20


def svg(graph: Graph, collapse: bool = False) -> str:
    """The graph as an SVG element: calls in layers by their depth from the input, each
    layer ordered by where its inputs sit, edges drawn downwards with arrowheads.

    A layout of its own rather than Mermaid's: the page it goes in must open without
    a network (Mermaid came from a CDN), and a trace's graph is a DAG whose node ids
    are already in dependency order, so longest-path layering is all it takes.
    """
    view = _View(graph, collapse)
    deps: dict[str, list[str]] = {"input": [], "output": []}
    labels: dict[str, tuple[str, str, bool]] = {
        "input": ("input", "", False),
        "output": ("output", "", False),
    }
    order = ["input"]
    for node in view.nodes:
        key = f"n{node.id}"
        path, kind = _caption(node)
        labels[key] = (path, kind, node.kind != "module")
        deps[key] = []
        order.append(key)
    order.append("output")
    for node_id in view.sources:
        deps[f"n{node_id}"].append("input")
    for a, b in view.edges:
        deps[f"n{b}"].append(f"n{a}")
    deps["output"] = [f"n{node_id}" for node_id in view.outputs] or ["input"]

    layer: dict[str, int] = {}
    for key in order:  # trace order is dependency order, so each dep has its layer already
        layer[key] = 1 + max((layer[d] for d in deps[key] if d in layer), default=-1)
    layer["output"] = max(layer.values()) + 1 if len(order) > 2 else 1
    layers: list[list[str]] = [[] for _ in range(layer["output"] + 1)]
    for key in order:
        layers[layer[key]].append(key)

    width = {key: _box_width(*labels[key][:2]) for key in order}
    centre: dict[str, float] = {}
    for row in layers:  # order each layer by the mean position of what it waits on
        row.sort(
            key=lambda k: (
                sum(centre[d] for d in deps[k]) / len(deps[k]) if deps[k] else 0.0,
                order.index(k),
            )
        )
        x = 0.0
        for key in row:
            centre[key] = x + width[key] / 2
            x += width[key] + _GAP_X
    row_width = {
        i: sum(width[k] for k in row) + _GAP_X * (len(row) - 1) for i, row in enumerate(layers)
    }
    total_width = max(row_width.values()) + 2 * _MARGIN
    for i, row in enumerate(layers):  # centre every layer on the widest
        shift = _MARGIN + (total_width - 2 * _MARGIN - row_width[i]) / 2
        for key in row:
            centre[key] += shift
    top = {key: _MARGIN + layer[key] * (_BOX_H + _GAP_Y) for key in order}
    height = top["output"] + _BOX_H + _MARGIN

    parts = [
        f'<svg class="plait-graph" width="{total_width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {total_width:.0f} {height:.0f}" role="img" '
        f'font-family="system-ui, sans-serif" font-size="{_FONT_PX}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        'fill="#555"/></marker></defs>',
    ]
    for key in order:
        for dep in deps[key]:
            x1, y1 = centre[dep], top[dep] + _BOX_H
            x2, y2 = centre[key], top[key]
            bend = (y2 - y1) / 2
            parts.append(
                f'<path class="edge" d="M {x1:.1f} {y1:.1f} C {x1:.1f} {y1 + bend:.1f}, '
                f'{x2:.1f} {y2 - bend:.1f}, {x2:.1f} {y2:.1f}" fill="none" stroke="#555" '
                'marker-end="url(#arrow)"/>'
            )
    for key in order:
        path, kind, is_op = labels[key]
        x, y, w = centre[key] - width[key] / 2, top[key], width[key]
        end = key in ("input", "output")
        style = ' stroke-dasharray="4 3"' if is_op else ""
        radius = _BOX_H / 2 if end else 8
        parts.append(
            f'<g class="node" id="{key}"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
            f'height="{_BOX_H}" rx="{radius:.0f}" fill="#f6f8fa" stroke="#333"{style}/>'
        )
        italic = ' font-style="italic"' if is_op else ""
        if kind:
            parts.append(
                f'<text x="{x + w / 2:.1f}" y="{y + 19:.1f}" text-anchor="middle"{italic}>'
                f"{html.escape(path)}</text>"
                f'<text x="{x + w / 2:.1f}" y="{y + 36:.1f}" text-anchor="middle" '
                f'font-size="11" fill="#666">{html.escape(kind)}</text></g>'
            )
        else:
            parts.append(
                f'<text x="{x + w / 2:.1f}" y="{y + 28:.1f}" text-anchor="middle">'
                f"{html.escape(path)}</text></g>"
            )
    parts.append("</svg>")
    return "\n".join(parts)


def _box_width(path: str, kind: str) -> float:
    return max(90.0, _CHAR_PX * max(len(path), len(kind) * 11 / 13) + 24)


def html_page(title: str, chart: str, digraph: str, listing: str, drawing: str = "") -> str:
    """A page that works offline: the graph as inline SVG, then its Mermaid and DOT
    sources (to paste into mermaid.live or Graphviz) and the node listing."""
    escaped = html.escape(title)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>plait graph: {escaped}</title>
<style>
  body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; }}
  pre {{ background: #f6f8fa; padding: 1rem; overflow-x: auto; }}
  .drawing {{ overflow-x: auto; }}
</style>
</head>
<body>
<h1>plait graph: {escaped}</h1>
<div class="drawing">
{drawing}
</div>
<h2>Nodes</h2>
<pre>{html.escape(listing)}</pre>
<h2>Mermaid</h2>
<p>Paste into <code>mermaid.live</code>, or into a Markdown file that renders Mermaid.</p>
<pre class="mermaid">
{html.escape(chart)}
</pre>
<h2>DOT</h2>
<p>Render with Graphviz: <code>dot -Tsvg graph.dot -o graph.svg</code>.</p>
<pre>{html.escape(digraph)}</pre>
</body>
</html>
"""
