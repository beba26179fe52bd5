"""The package's layering, read from its source: every import (at module level, inside a
function, or for type checking only) goes from a higher layer to a lower one, no modules import
each other in a cycle, outside ``relay/`` only the app composes the relay's sessions, and no
class takes state from two bases.

The layers are the map in docs/architecture.md ("Layers"); a new module or package must be
placed in one before this test passes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "sfu_sidecar"

# Bottom to top. A name is a top-level module or package of sfu_sidecar ("" is the package's own
# __init__). A layer may import only from the layers below it and from within one name.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "exceptions", "logs", "streamname", "ntptime", "resample", "estimators", "synthetic"),
    ("settingvalues", "tts"),
    ("config",),
    ("metrics", "tasks", "lifecycle", "limits", "cors", "tls", "webfiles"),
    ("httpapi", "listeners", "workermetrics"),
    ("clock",),
    ("captions",),
    ("sync",),
    ("relay",),
    ("syncchannel",),
    ("speech",),
    ("probe", "segments"),
    ("client",),
    ("app", "workerproxy"),
    ("workers", "demo"),
    ("cli",),
    ("__main__",),
)
# The relay's public seam, for every feature: observers and read-only views (hooks), the aiortc
# adapter and the packet codecs the Python clients share. Its routes and service are the app's.
RELAY_PUBLIC = {"relay.hooks", "relay.aiortc_adapter", "relay.packet", "relay.vp9"}
RELAY_COMPOSER = "app"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "web" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every sfu_sidecar module ``name`` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
                origin = "sfu_sidecar" + ("." + origin if origin else "")
            else:
                origin = node.module or ""
            # `from pkg import module` names a module; `from module import name` does not.
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}"[12:] in known else origin
                       for a in node.names]
        for target in targets:
            if target == "sfu_sidecar" or target.startswith("sfu_sidecar."):
                inner = target[12:]
                if inner in known:
                    yield inner


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: set(imports(name, path, known)) - {name} for name, path in found.items()}


def top(name: str) -> str:
    return name.split(".")[0]


def layer_of(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if top(name) in layer:
            return index
    raise AssertionError(f"sfu_sidecar.{name} is in no layer: place {top(name)!r} in LAYERS "
                         "(tests/test_layers.py) and in docs/architecture.md")


@pytest.mark.unit
def test_every_module_is_placed_in_one_layer() -> None:
    names = [n for layer in LAYERS for n in layer]
    assert len(names) == len(set(names)), "a name in two layers"
    for name in modules():
        layer_of(name)


@pytest.mark.unit
def test_imports_only_go_down() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                    if top(a) != top(b) and layer_of(a) <= layer_of(b))
    assert upward == [], "imports from a layer to one at or above it:\n" + "\n".join(upward)


@pytest.mark.unit
def test_no_modules_import_each_other_in_a_cycle() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
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
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.unit
def test_only_the_app_composes_the_relay() -> None:
    reaching = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                      if top(b) == "relay" and top(a) not in ("relay", RELAY_COMPOSER)
                      and b not in RELAY_PUBLIC)
    assert reaching == [], "relay internals used outside relay/:\n" + "\n".join(reaching)


@pytest.mark.unit
def test_no_class_inherits_state_from_two_bases() -> None:
    """Composition over multiple inheritance: a class with several bases may add only
    protocols (interfaces) to one base that carries state."""
    mixed = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and len(node.bases) > 1:
                others = [ast.unparse(b) for b in node.bases]
                if "Protocol" not in others:
                    mixed.append(f"{name}.{node.name}({', '.join(others)})")
    assert mixed == []


@pytest.mark.unit
def test_the_reader_counts_function_level_relative_and_type_only_imports(
        tmp_path: Path) -> None:
    source = tmp_path / "view.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import hooks\n"
        "from ..sync.mapping import CaptureTime\n"
        "if TYPE_CHECKING:\n"
        "    from sfu_sidecar.relay.service import RelayService\n"
        "def late() -> None:\n"
        "    import sfu_sidecar.client.whip\n")
    known = set(modules())
    assert set(imports("relay.view", source, known)) == {
        "relay.hooks", "sync.mapping", "relay.service", "client.whip"}
    # Placed in relay, the function-level import of the client kit would go up a layer.
    assert layer_of("client.whip") > layer_of("relay.view")
