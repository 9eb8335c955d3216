"""The topology graph as SVG, drawn on the server: injectors, streams and computations in
columns from left (where records enter) to right, each node with its health colour and its
watermark lag, edges along the streams.

Every name is the user's (streams, computations, injectors): each is escaped for XML text or
an attribute before it goes into the drawing, so a name like ``<script>`` shows as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

__all__ = ["draw_graph", "layout"]

_WIDTH, _HEIGHT, _GAP_X, _GAP_Y, _MARGIN = 180, 46, 44, 18, 10
_LABEL = 26  # characters of a name shown; the full name is the node's tooltip


def layout(
    nodes: Sequence[Mapping[str, Any]], edges: Sequence[Mapping[str, str]]
) -> dict[str, tuple[int, int]]:
    """Each node's ``(column, row)``: a node's column is one more than the furthest of the
    nodes with an edge into it, rows in name order. A cycle is cut at the edge that closes it,
    found from the nodes nothing flows into (where records enter) onwards."""
    ids = sorted(n["id"] for n in nodes)
    out: dict[str, list[str]] = {n: [] for n in ids}
    for edge in edges:
        if edge["from"] in out and edge["to"] in out:
            out[edge["from"]].append(edge["to"])
    entered = {t for targets in out.values() for t in targets}
    into: dict[str, list[str]] = {n: [] for n in ids}
    done: set[str] = set()
    for root in [n for n in ids if n not in entered] + ids:
        # Depth first, without recursion; an edge to a node on the path closes a cycle.
        if root in done:
            continue
        path, stack = {root}, [(root, iter(out[root]))]
        done.add(root)
        while stack:
            node, targets = stack[-1]
            target = next(targets, None)
            if target is None:
                path.discard(node)
                stack.pop()
            elif target not in path:
                into[target].append(node)
                if target not in done:
                    done.add(target)
                    path.add(target)
                    stack.append((target, iter(out[target])))
    columns: dict[str, int] = {}
    for node in _topological(ids, into):
        columns[node] = 1 + max((columns[n] for n in into[node]), default=-1)
    rows: dict[int, int] = {}
    placed = {}
    for node in sorted(into, key=lambda n: (columns[n], n)):
        placed[node] = (columns[node], rows.get(columns[node], 0))
        rows[columns[node]] = rows.get(columns[node], 0) + 1
    return placed


def draw_graph(nodes: Sequence[Mapping[str, Any]], edges: Sequence[Mapping[str, str]]) -> str:
    """The SVG document of the graph (empty of nodes: a line that says so)."""
    if not nodes:
        return (
            '<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="420" height="40">'
            '<text x="10" y="25">No source has reported on the watermark topic yet.</text></svg>'
        )
    placed = layout(nodes, edges)
    width = (max(c for c, _ in placed.values()) + 1) * (_WIDTH + _GAP_X) - _GAP_X + 2 * _MARGIN
    height = (max(r for _, r in placed.values()) + 1) * (_HEIGHT + _GAP_Y) - _GAP_Y + 2 * _MARGIN
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="topology graph">',
        # In user space: a thicker (highlighted) line keeps the arrowhead's size.
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="9" '
        'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" '
        'class="arrowhead"/></marker></defs>',
    ]
    for edge in edges:
        if edge["from"] not in placed or edge["to"] not in placed:
            continue
        x1, y1 = _anchor(placed[edge["from"]], right=True)
        x2, y2 = _anchor(placed[edge["to"]], right=False)
        middle = (x1 + x2) / 2
        parts.append(
            f'<path class="edge" data-from={quoteattr(edge["from"])} data-to='
            f'{quoteattr(edge["to"])} d="M {x1} {y1} C {middle} {y1}, {middle} {y2}, {x2} {y2}" '
            'marker-end="url(#arrow)"/>'
        )
    shared = _shared_prefix([str(n["name"]) for n in nodes])
    for node in nodes:
        column, row = placed[node["id"]]
        x, y = _MARGIN + column * (_WIDTH + _GAP_X), _MARGIN + row * (_HEIGHT + _GAP_Y)
        name = str(node["name"])
        label = _label(name, shared)
        kind = str(node["kind"])
        health = str(node.get("health", "ok"))
        parts.append(
            f'<g class="node {escape(kind)} health-{escape(health)}" '
            f'data-node={quoteattr(str(node["id"]))} tabindex="0">'
            f"<title>{escape(kind)} {escape(name)}</title>"
            f'<rect x="{x}" y="{y}" width="{_WIDTH}" height="{_HEIGHT}" rx="6"/>'
            f'<text x="{x + 8}" y="{y + 18}" class="label">{escape(label)}</text>'
            f'<text x="{x + 8}" y="{y + 36}" class="detail">{escape(_detail(node))}</text>'
            "</g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _topological(ids: Sequence[str], into: Mapping[str, Sequence[str]]) -> list[str]:
    """``ids`` with every node after the nodes with an edge into it (``into`` has no cycle)."""
    ordered: list[str] = []
    placed: set[str] = set()
    waiting = {n: len(set(into[n])) for n in ids}
    users: dict[str, set[str]] = {n: set() for n in ids}
    for node in ids:
        for before in into[node]:
            users[before].add(node)
    ready = [n for n in ids if waiting[n] == 0]
    while ready:
        node = ready.pop(0)
        ordered.append(node)
        placed.add(node)
        for user in sorted(users[node]):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return ordered


def _shared_prefix(names: Sequence[str]) -> str:
    """The start that all ``names`` share, up to a separator (``_ . - /``), when it is long
    enough to crowd the labels (a run's names often share a long one)."""
    if len(names) < 2:
        return ""
    first, last = min(names), max(names)  # the shared start of all is theirs
    length = next(
        (i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first)
    )
    common = first[:length]
    cut = max(common.rfind(c) for c in "_.-/") + 1
    return common[:cut] if cut >= 8 else ""


def _label(name: str, shared: str) -> str:
    """A node's label: its name without the shared start (the title keeps it whole), and
    at most ``_LABEL`` characters, its middle left out (both ends tell names apart)."""
    if shared and name.startswith(shared) and len(name) > len(shared):
        name = "\u2026" + name[len(shared) :]
    if len(name) <= _LABEL:
        return name
    half = (_LABEL - 1) // 2
    return name[:half] + "\u2026" + name[-(_LABEL - 1 - half) :]


def _anchor(place: tuple[int, int], *, right: bool) -> tuple[int, int]:
    column, row = place
    x = _MARGIN + column * (_WIDTH + _GAP_X) + (_WIDTH if right else 0)
    return x, _MARGIN + row * (_HEIGHT + _GAP_Y) + _HEIGHT // 2


def _detail(node: Mapping[str, Any]) -> str:
    """The node's second line: a stream's rate and size, a source's lag or state."""
    if node["kind"] == "stream":
        rate = node.get("rate")
        said = f"{node.get('records', 0):,} records"
        return said if rate is None else f"{rate:,.0f}/s · {said}"
    if node.get("state") == "complete":
        return "complete"
    if node.get("state") == "no report yet":
        return "no report yet"
    lag = node.get("lag_s")
    said = "lag ?" if lag is None else f"lag {_duration(lag)}"
    rate, out = node.get("in_rate"), node.get("out_rate")
    if rate is None:
        return said
    return f"{said} · {rate:,.0f}/s in" + ("" if out is None else f", {out:,.0f} out")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86_400:,.0f} d"
