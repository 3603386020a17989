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

from plait.cli.inputs import FORMATS, InputError, Item, first_item, open_inputs
from plait.cli.options import parse_target_args, target_parser
from plait.cli.target import Target, TargetError
from plait.module import Module
from plait.resources.config import ConfigurationError
from plait.tracing.graph import Graph, Node, NodeRef, references
from plait.tracing.tracer import TracingError, trace

__all__ = ["build_parser", "dot", "html_page", "main", "mermaid"]

#: Where the HTML page loads Mermaid from: the page is for a browser, which fetches it.
MERMAID_CDN = "https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.esm.min.mjs"

DESCRIPTION = """\
Trace TARGET on one sample input and print its call graph: no model is called.

The sample is --input TEXT, or the first input of --input FILE (or - for stdin),
read as `plait run` reads inputs; without --input each required parameter of
forward() gets a placeholder ("<name>").  Nodes are labelled with their module
path and kind; ops (indexing, attribute and method calls on outputs) are drawn
dashed, or left out with --ops collapsed.  --html FILE also writes a page with
the Mermaid diagram (rendered by Mermaid from a CDN in your browser) and the DOT.
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
        page = html_page(title, chart, digraph, graph.describe())
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
    for param in inspect.signature(module.forward).parameters.values():
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


def html_page(title: str, chart: str, digraph: str, listing: str) -> str:
    escaped = html.escape(title)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>plait graph: {escaped}</title>
<style>
  body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; }}
  pre {{ background: #f6f8fa; padding: 1rem; overflow-x: auto; }}
  pre.mermaid {{ background: none; }}
</style>
</head>
<body>
<h1>plait graph: {escaped}</h1>
<pre class="mermaid">
{html.escape(chart)}
</pre>
<h2>Nodes</h2>
<pre>{html.escape(listing)}</pre>
<h2>DOT</h2>
<p>Render with Graphviz: <code>dot -Tsvg graph.dot -o graph.svg</code>.</p>
<pre>{html.escape(digraph)}</pre>
<script type="module">
  import mermaid from "{MERMAID_CDN}";
  mermaid.initialize({{ startOnLoad: true }});
</script>
</body>
</html>
"""
