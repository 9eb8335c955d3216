"""The topology graph's SVG: columns follow the streams, and every user-controlled name is
text, never markup."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from millstream.ui.graph import draw_graph, layout

pytestmark = pytest.mark.unit

SVG = "{http://www.w3.org/2000/svg}"
SCRIPT = "<script>k()</script>"
IMAGE = '"><img src=x onerror="window.pwned=1">'


def test_columns_follow_the_streams_and_a_cycle_does_not_loop() -> None:
    nodes = [{"id": i} for i in ("injector/f", "stream/a", "c/x", "stream/b", "c/y")]
    edges = [
        {"from": "injector/f", "to": "stream/a"},
        {"from": "stream/a", "to": "c/x"},
        {"from": "c/x", "to": "stream/b"},
        {"from": "stream/b", "to": "c/y"},
        {"from": "c/y", "to": "stream/a"},  # a cycle back to the start
    ]
    placed = layout(nodes, edges)
    assert placed["injector/f"][0] == 0
    assert placed["c/x"][0] < placed["stream/b"][0] < placed["c/y"][0]
    assert len(set(placed.values())) == len(nodes)


def test_names_are_escaped_text() -> None:
    nodes = [
        {
            "id": f"computation/t/{SCRIPT}",
            "kind": "computation",
            "name": SCRIPT,
            "state": "reporting",
            "lag_s": 3.0,
            "health": "stalled",
        },
        {"id": f"stream/{IMAGE}", "kind": "stream", "name": IMAGE, "records": 2, "rate": None},
    ]
    edges = [{"from": f"stream/{IMAGE}", "to": f"computation/t/{SCRIPT}"}]
    svg = draw_graph(nodes, edges)
    assert "<script" not in svg
    assert "<img" not in svg
    root = ElementTree.fromstring(svg)  # well-formed
    groups = root.findall(f"{SVG}g")
    assert [g.get("data-node") for g in groups] == [n["id"] for n in nodes]
    labels = [g.find(f"{SVG}text").text for g in groups]  # type: ignore[union-attr]
    assert labels[0] == SCRIPT
    assert labels[1] is not None
    head, _, tail = labels[1].partition("\u2026")
    assert IMAGE.startswith(head)
    assert IMAGE.endswith(tail)
    assert [g.find(f"{SVG}title").text for g in groups] == [  # type: ignore[union-attr]
        f"computation {SCRIPT}",
        f"stream {IMAGE}",
    ]
    edge = root.find(f"{SVG}path")
    assert edge is not None
    assert edge.get("data-from") == f"stream/{IMAGE}"
    assert "health-stalled" in (groups[0].get("class") or "")


def test_an_empty_topology_says_so() -> None:
    assert "No source has reported" in draw_graph([], [])


def test_labels_leave_out_the_start_all_names_share_and_long_middles() -> None:
    names = ["zeitgeist_20261127t194241_nab_model", "zeitgeist_20261127t194241_nab.counts"]
    nodes = [{"id": n, "kind": "stream", "name": n, "records": 0} for n in names]
    root = ElementTree.fromstring(draw_graph(nodes, []))
    labels = [g.find(f"{SVG}text").text for g in root.findall(f"{SVG}g")]  # type: ignore[union-attr]
    assert labels == ["\u2026nab_model", "\u2026nab.counts"]
    long = [{"id": "x", "kind": "stream", "name": "a" * 20 + "b" * 20, "records": 0}]
    label = ElementTree.fromstring(draw_graph(long, [])).find(f"{SVG}g/{SVG}text")
    assert label is not None
    assert label.text == "a" * 12 + "\u2026" + "b" * 13
