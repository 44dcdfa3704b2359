"""The import graph points one way (issue 28, part 9): every module's imports, read with `ast` (those inside
functions and under `if TYPE_CHECKING:` too: a type-only import is still a dependency a reader follows),
give a graph between packages that has no cycle, in which `zsim.config` imports nothing of zsim but
`errors`, and every package imports only the layers below its own. LAYERS is the one place that order is
written; docs/architecture.md draws it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top. A package may import its own modules and those of the layers below; packages of one
# layer do not import each other. `zsim` is the package's own __init__ (its __version__); `runtime` is
# the repository's runtime/ folder, installed as zsim.runtime (setup.py). Top-level modules (cli.py,
# api.py, errors.py, __main__.py) count as packages of their own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "zsim"),
    ("config",),  # scenario and profile files: schema, reading, --set overrides
    ("console", "trace", "parallel", "memory", "workload"),
    ("compute",),
    ("fabric",),
    ("zero",),
    ("scenario",),  # builds the validated Scenario: config's files cross-checked against the domain
    ("engine",),
    ("report",),
    ("calibrate", "sweep"),
    ("runtime",),
    ("commands",),
    ("validate",),  # its suites call commands (maxsize, calibrate, replay); `zsim validate` is here too
    ("cli",),
    ("api", "__main__"),
)
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules() -> dict[str, tuple[str, Path]]:
    """{dotted module name: (package, file)} of zsim/ and runtime/ (as zsim.runtime)."""
    out = {}
    for base, prefix in ((ROOT / "zsim", ("zsim",)), (ROOT / "runtime", ("zsim", "runtime"))):
        for path in sorted(base.rglob("*.py")):
            parts = (*prefix, *path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            package = parts[1] if len(parts) > 1 else "zsim"
            out[".".join(parts)] = (package, path)
    return out


def _imports(module: str, source: str, is_package: bool = False) -> set[str]:
    """The absolute names of zsim modules and attributes the `source` of `module` imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names |= {origin} | {f"{origin}.{a.name}" for a in node.names}
    return {n for n in names if n == "zsim" or n.startswith("zsim.")}


def package_graph() -> dict[str, dict[str, set[str]]]:
    """{package: {imported package: the files that import it}} between zsim's packages."""
    modules = _modules()
    graph: dict[str, dict[str, set[str]]] = {package: {} for package, _ in modules.values()}
    for module, (package, path) in modules.items():
        for name in _imports(module, path.read_text(), path.name == "__init__.py"):
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else "zsim"
            if target == "__version__":
                target = "zsim"
            if target != package:
                graph[package].setdefault(target, set()).add(str(path.relative_to(ROOT)))
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The cycles among packages: one list of packages per strongly connected component of more than one
    (Tarjan's algorithm), empty when the graph is acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_package_has_a_layer():
    assert set(package_graph()) - set(LAYER_OF) == set(), "place the new package in LAYERS (and docs/architecture.md)"


def test_config_imports_nothing_of_zsim_but_errors():
    assert set(package_graph()["config"]) == {"errors"}, package_graph()["config"]


def test_no_cycles_between_packages():
    graph = package_graph()
    assert cycles(graph) == [], {" <-> ".join(c): {p: sorted(graph[p]) for p in c} for c in cycles(graph)}


def test_packages_import_only_the_layers_below():
    upward = {f"{package} -> {target}": sorted(files)
              for package, targets in package_graph().items() for target, files in targets.items()
              if LAYER_OF[target] >= LAYER_OF[package]}
    assert upward == {}, upward


def test_the_checks_themselves_catch_a_cycle_and_an_upward_import():
    """The functions above find what they are for (a check that cannot fail checks nothing)."""
    assert cycles({"a": {"b": set()}, "b": {"c": set()}, "c": {"a": set()}, "d": {"a": set()}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": set()}, "b": {}}) == []
    source = "from ..engine import simulation\nimport zsim.fabric.nccl\ndef f():\n    from zsim.zero import plan\n"
    assert _imports("zsim.config.example", source) >= {"zsim.engine", "zsim.engine.simulation", "zsim.fabric.nccl",
                                                       "zsim.zero.plan"}
    assert _imports("zsim.config", "from . import schema", is_package=True) == {"zsim.config", "zsim.config.schema"}


@pytest.mark.parametrize("name", ["PROTOCOLS", "LL128_COLLECTIVES", "LL128_CEILING"])
def test_profile_schema_names_nccl_as_fabric_does(name):
    """config cannot import zsim.fabric.nccl, so the profile schema spells NCCL's protocols and LL128
    collectives itself: they must stay the fabric's."""
    from zsim.config import profile_files
    from zsim.fabric import nccl

    assert getattr(profile_files, name) == getattr(nccl, name)
