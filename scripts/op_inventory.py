#!/usr/bin/env python3
"""Print the ONNX op types (per opset domain/version) used by every fixture model, as Markdown.

    .venv/bin/python scripts/op_inventory.py            # examples/, fixtures/transformers/, fixtures/large/**
    .venv/bin/python scripts/op_inventory.py a.onnx b.onnx

Needs only the onnx package. The output is what docs/FIXTURES.md's op tables are pasted from.
Ops inside subgraphs (If/Loop/Scan bodies) are counted too.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent


def ops_of(path: Path) -> tuple[dict, dict]:
    m = onnx.load(str(path), load_external_data=False)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def walk(g: onnx.GraphProto) -> None:
        for n in g.node:
            counts[n.domain or "ai.onnx"][n.op_type] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(m.graph)
    opsets = {(o.domain or "ai.onnx"): o.version for o in m.opset_import}
    return opsets, counts


def default_models() -> list[Path]:
    found = sorted(ROOT.glob("examples/*/model.onnx"))
    found += sorted(ROOT.glob("fixtures/transformers/*/model.onnx"))
    found += sorted(ROOT.glob("fixtures/large/*/model.onnx"))
    found += sorted(ROOT.glob("fixtures/large/light/*/model.onnx"))
    return found


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or default_models()
    union: dict[tuple[str, int], set] = collections.defaultdict(set)
    print("| model | opset | op types (count) |")
    print("| --- | --- | --- |")
    for p in paths:
        opsets, counts = ops_of(p)
        try:
            label = str(p.resolve().parent.relative_to(ROOT))
        except ValueError:
            label = str(p)
        cells = []
        for dom, c in sorted(counts.items()):
            pre = "" if dom == "ai.onnx" else f"{dom}::"
            cells.append(", ".join(f"{pre}{k} ({v})" for k, v in sorted(c.items())))
            for k in c:
                union[(dom, opsets.get(dom, 0))].add(k)
        ops = "; ".join(cells)
        ver = ", ".join(f"{d} {v}" if d != "ai.onnx" else str(v) for d, v in sorted(opsets.items()))
        print(f"| `{label}` | {ver} | {ops} |")
    print()
    print("Union of op types per opset:")
    print()
    for (dom, ver), ops in sorted(union.items()):
        print(f"- {dom} opset {ver} ({len(ops)}): {', '.join(sorted(ops))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
