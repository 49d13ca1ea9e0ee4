"""The package's layering (README "Layout"): every import, deferred ones included, goes from a
layer to one below it or stays inside its own unit, and no modules import each other in a circle.
Read from the source with `ast`, so it also sees imports inside functions."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "electra_tf"

# Bottom up, as README "Layout" lists them. A unit is a module or a sub-package of electra_tf.
LAYERS = [
    {"files", "progress", "cpu"},
    {"cli", "run_folder", "data", "warmup"},
    {"config"},
    {"models"},
    {"convert"},
    {"training", "__init__"},
    {"finetune"},
    {"signatures"},
    {"export", "keras_objects"},
    {"scoring"},
    {"electric_export"},
    {"experiments"},
    {"tools", "configs"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
# The local server stands apart: it serves any SavedModel, imports no library module, and any
# layer may use it (the demo and electra-serve do).
APART = {"serving"}


def _modules() -> dict[str, pathlib.Path]:
    """electra_tf.* module name -> file, for the library proper (the installed folders beside it
    that live in the checkout as serving/, tools/, configs/ are mapped in by setup.py)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for folder in ("tools", "serving", "configs"):
        for path in (ROOT / folder).glob("*.py"):
            name = path.stem
            found[f"electra_tf.{folder}" + ("" if name == "__init__" else f".{name}")] = path
    return found


def _runtime_nodes(node):
    """Every node under `node` but those of `if TYPE_CHECKING:` blocks (annotations only)."""
    for child in ast.iter_child_nodes(node):
        test = getattr(child, "test", None) if isinstance(child, ast.If) else None
        if test is not None and "TYPE_CHECKING" in ast.unparse(test):
            yield from (n for stmt in child.orelse for n in [stmt, *_runtime_nodes(stmt)])
            continue
        yield child
        yield from _runtime_nodes(child)


def _imports(path: pathlib.Path, modules: dict) -> set[str]:
    """The electra_tf modules `path` imports when it runs, anywhere in the file."""
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from P import x`: the module P.x when x is one, else (a name defined in P) P.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name.startswith("electra_tf"):
                out.add(name)
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_unit_has_a_layer(graph):
    units = {_unit(m) for m in graph}
    assert units - set(RANK) - APART == set(), "add the new unit to LAYERS and README Layout"


def test_no_import_runs_up_a_layer(graph):
    upward = []
    for module, imported in graph.items():
        for target in imported:
            a, b = _unit(module), _unit(target)
            if a == b or b in APART:
                continue
            if a in APART or RANK[b] >= RANK[a]:
                upward.append((module, target))
    assert not upward, upward


def test_no_import_circle(graph):
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, circles
