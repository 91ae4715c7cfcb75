"""Arrows only point down: what each part of the project may import, read from its source.

- the models, their losses and optimizers, and the layers import nothing of the training
  plumbing, the commands or the training side of an application (a model is a Keras model;
  training attaches to it);
- `tfx_transformer`, the shared core, imports neither application (they register what the
  shared commands need: `tfx_transformer.applications`);
- no two modules import each other, directly or through others.

Every ``import`` statement counts, also one inside a function.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tfx_transformer", "nlp", "vision")
TRAINING = ("tfx_transformer.training", "tfx_transformer.commands", "nlp.training", "nlp.commands",
            "vision.training", "vision.commands")
MODEL_CODE = ("tfx_transformer/layers/", "tfx_transformer/replicas.py",
              "tfx_transformer/registry.py", "nlp/modeling/", "nlp/search/",
              "vision/modeling/", "vision/matching/")


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, top_level_only: bool = False) -> set[str]:
    """The project modules ``path`` imports (``from a import b`` counts as a and a.b)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _sources():
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _upward(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    relative = path.relative_to(root).as_posix()
    if relative.startswith(MODEL_CODE):
        return sorted(n for n in _imports(path) if _within(n, TRAINING))
    if relative.startswith("tfx_transformer/"):
        return sorted(n for n in _imports(path) if _within(n, ("nlp", "vision")))
    return []


def test_no_module_imports_upward():
    wrong = {str(p.relative_to(ROOT)): _upward(p) for p in _sources() if _upward(p)}
    assert not wrong, f"imports that point up: {wrong}"


@pytest.mark.parametrize("path, line", [
    ("nlp/modeling/model.py", "from tfx_transformer.training.saving import check_finite"),
    ("vision/modeling/detr.py", "import vision.training.train"),
    ("tfx_transformer/commands/quickstart.py", "from nlp.training.train import train_nmt"),
])
def test_the_rule_sees_an_upward_import(tmp_path, path, line):
    copy = tmp_path / path  # the module as it is, with one upward import added in a function
    copy.parent.mkdir(parents=True)
    copy.write_text((ROOT / path).read_text(encoding="utf-8") + f"\n\ndef f():\n    {line}\n",
                    encoding="utf-8")
    assert not _upward(ROOT / path) and _upward(copy, root=tmp_path), line


def test_no_two_modules_import_each_other():
    modules = {_module(p): p for p in _sources()}
    graph = {name: {m for m in _imports(path) if m in modules and m != name}
             for name, path in modules.items()}
    for name in modules:  # a package's modules import the package itself first
        graph[name] -= {name.rsplit(".", 1)[0]} if "." in name else set()
    cycles, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, f"modules that import each other: {cycles}"
