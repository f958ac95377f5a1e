"""The import graph of crawlq's packages, read from the code by grimp (import-linter's own
graph library): which package imports which, the imports that run up the layers, the
cycles between packages, and the shape figures issue 48 tracks::

    python tests/import_graph.py            # the graph, then the figures
    python tests/import_graph.py --imports  # and the module imports behind each edge

A node is a package: each subpackage (``common.queue``, ``common.redis``,
``consumer.sinks``, ...), each of the few modules left at ``common``'s top level (the
cross-domain ones every package shares: ``common.errors``, ``common.keys``, ...), and the
other top-level modules of a package under its name (``consumer``). The layers are
pyproject.toml's import-linter contracts: each package imports ``common`` and no other of
crawlq's (the console, the producer, the consumer, the ``crawlq`` facade), and inside
``common`` the layers of its contract, top first, ``|`` between packages that may not
import each other. tests/test_import_graph.py
holds the tree to 0 imports up and to the cycles it knows.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grimp  # import-linter's graph library: installed with it (the dev extra)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "producer", "consumer", "console", "crawlq")
LONG = 600  # lines: issue 48's limit for a source file
#: Endings a word takes that keep its meaning: ``leases``/``leaser``/``leasing``.
_INFLECTION = re.compile(r"(ing|ers|er|es|ed|s|e)$")

Edges = Mapping[tuple[str, str], int]


def node_of(module: str, packages: set[str]) -> str:
    """The node `module` belongs to (see the module docstring)."""
    package = module if module in packages else module.rpartition(".")[0] or module
    return module if package == "common" and module != "common" else package


@dataclass(frozen=True)
class Graph:
    edges: dict[tuple[str, str], int]  # (importer, imported) -> how many module imports
    imports: dict[tuple[str, str], list[str]]  # the same -> "a.b:12 -> c.d" each

    @classmethod
    def read(cls, root: Path = ROOT) -> Graph:
        sys.path.insert(0, str(root))
        graph = grimp.build_graph(*PACKAGES, cache_dir=None)
        packages = {m for m in graph.modules
                    if (root / m.replace(".", "/") / "__init__.py").is_file()}
        edges: Counter[tuple[str, str]] = Counter()
        imports: dict[tuple[str, str], list[str]] = defaultdict(list)
        for module in sorted(graph.modules):
            for imported in sorted(graph.find_modules_directly_imported_by(module)):
                pair = node_of(module, packages), node_of(imported, packages)
                if pair[0] != pair[1]:
                    edges[pair] += 1
                    for detail in graph.get_import_details(importer=module, imported=imported):
                        imports[pair].append(f"{module}:{detail['line_number']} -> {imported}")
        return cls(dict(edges), dict(imports))


def common_layers(pyproject: Path = ROOT / "pyproject.toml") -> list[list[str]]:
    """The layers of the contract inside ``common``, top first: each a list of module
    names, ``"|"`` among them when they may not import each other."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"]
                  if c.get("type") == "layers" and c.get("containers") == ["common"]]
    return [[f"common.{name.strip()}" for name in re.split(r"[|:]", layer)]
            + (["|"] if "|" in layer else []) for layer in contract["layers"]]


def _place(node: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """The rank of `node`'s layer (0: the top) and the member of it `node` is in."""
    for rank, layer in enumerate(layers):
        for name in layer:
            if node == name or node.startswith(name + "."):
                return rank, name
    return None


def imports_up(edges: Edges, inner: list[list[str]] | None = None) -> list[tuple[str, str]]:
    """The edges that break the layers: a package importing another of crawlq's but
    ``common``, a module of ``common`` one of a layer above its own (`inner`: by default
    the contract's), or a module of its own layer where that layer says ``|``."""
    inner = common_layers() if inner is None else inner
    up = []
    for importer, imported in edges:
        a, b = importer.split(".")[0], imported.split(".")[0]
        if a != b:
            if b != "common":
                up.append((importer, imported))
            continue
        pa, pb = _place(importer, inner), _place(imported, inner)
        if pa and pb and (pb[0] < pa[0] or (pa[0] == pb[0] and pa[1] != pb[1]
                          and "|" in inner[pa[0]])):
            up.append((importer, imported))
    return sorted(up)


def cycles(edges: Edges) -> list[list[str]]:
    """The strongly connected sets of nodes (Tarjan): each a cycle or several, sorted."""
    after: dict[str, list[str]] = defaultdict(list)
    for importer, imported in sorted(edges):
        after[importer].append(imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in after[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted({n for pair in edges for n in pair}):
        if node not in index:
            visit(node)
    return sorted(found)


def common_top_modules(root: Path = ROOT) -> list[str]:
    return sorted(p.stem for p in (root / "common").glob("*.py") if p.name != "__init__.py")


def long_files(root: Path = ROOT, limit: int = LONG) -> list[tuple[str, int]]:
    """Source files over `limit` lines, longest first."""
    sizes = [(p.relative_to(root).as_posix(), len(p.read_text(encoding="utf-8").splitlines()))
             for package in PACKAGES for p in (root / package).rglob("*.py")]
    return sorted(((f, n) for f, n in sizes if n > limit), key=lambda x: -x[1])


def suffix_twins(names: Iterable[str]) -> list[tuple[str, str]]:
    """Pairs of module names that differ only by a suffix: one name, less an ending that
    keeps its meaning (``s``, ``er``, ``ing``, ...), starts the other (``leases`` /
    ``leaser`` / ``leasing``, ``traps`` / ``trapbook``, ``history`` /
    ``history_record``, ``cli`` / ``cli_hosts``); a stem of three letters at least."""
    names = sorted(set(names))
    stems = {name: _INFLECTION.sub("", name) for name in names}
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if any(len(stems[x]) >= 3 and y.startswith(stems[x]) for x, y in ((a, b), (b, a)))]


def package_twins(root: Path = ROOT) -> dict[str, list[tuple[str, str]]]:
    """suffix_twins of each package's modules and subpackages."""
    found = {}
    for init in sorted(p for package in PACKAGES for p in (root / package).rglob("__init__.py")):
        here = init.parent
        names = [p.stem for p in here.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        names += [p.parent.name for p in here.glob("*/__init__.py")]
        if twins := suffix_twins(names):
            found[init.parent.relative_to(root).as_posix()] = twins
    return found


def report(graph: Graph, show_imports: bool = False) -> str:
    lines = [f"packages: {len({n for pair in graph.edges for n in pair})} nodes, "
             f"{len(graph.edges)} edges (an importer, then what it imports: how many "
             "module imports)"]
    by_importer: dict[str, list[str]] = defaultdict(list)
    for (importer, imported), n in sorted(graph.edges.items()):
        by_importer[importer].append(f"{imported} {n}")
        if show_imports:
            by_importer[importer] += [f"    {i}" for i in graph.imports[importer, imported]]
    for importer, imported in by_importer.items():
        lines.append(f"  {importer} -> " + ", ".join(i for i in imported if i[0] != " "))
        lines += [i for i in imported if i[0] == " "]
    up = imports_up(graph.edges)
    lines.append(f"imports up the layers: {len(up)}")
    lines += [f"  {a} -> {b}: " + "; ".join(graph.imports[a, b]) for a, b in up]
    found = cycles(graph.edges)
    lines.append(f"cycles between packages: {len(found)}")
    for part in found:
        lines.append("  " + " <-> ".join(part) + ": " + "; ".join(
            i for a in part for b in part if (a, b) in graph.imports for i in graph.imports[a, b]))
    top = common_top_modules()
    lines.append(f"modules at common's top level: {len(top)} ({', '.join(top)})")
    long = long_files()
    lines.append(f"source files over {LONG} lines: {len(long)} ("
                 + ", ".join(f"{f} {n}" for f, n in long) + ")")
    twins = package_twins()
    lines.append(f"module names in one package that differ only by a suffix: "
                 f"{sum(map(len, twins.values()))} pairs")
    lines += [f"  {package}/: " + ", ".join(f"{a} / {b}" for a, b in pairs)
              for package, pairs in twins.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imports", action="store_true",
                        help="list the module imports behind each edge")
    args = parser.parse_args(argv)
    graph = Graph.read()
    print(report(graph, args.imports))
    return 1 if imports_up(graph.edges) else 0


if __name__ == "__main__":
    sys.exit(main())
