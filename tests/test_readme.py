"""The README's Python example runs as written."""

import pathlib
import re


def test_readme_layer_example_runs():
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(import numpy.*?)```", text, re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert tuple(namespace["logits"].shape) == (1, 3, 1000)


README = pathlib.Path(__file__).parents[1] / "README.md"
ROOT = README.parent
PACKAGES = ("tfx_transformer", "nlp", "vision")


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_readme_paths_exist():
    text = README.read_text()
    paths = {p for p in re.findall(r"`([\w./-]+(?:/|\.py))`", text)
             if p.split("/")[0] in PACKAGES + ("scripts", "benchmarks", "tests")}
    assert paths, "no paths found in README.md"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_readme_dotted_names_import():
    """``nlp.export.load_translator`` and the like: the module imports, the name is in it."""
    import importlib

    text = README.read_text()
    names = {n for n in re.findall(r"`((?:%s)(?:\.\w+)+)" % "|".join(PACKAGES), text)}
    assert len(names) > 5, names
    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module
            try:
                module = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            obj = module
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(name)
            break
        else:
            missing.append(name)
    assert not missing, f"README.md names what does not exist: {missing}"


def test_layout_names_existing_modules():
    """Each bare `name` of a Layout item is a module or package in the item's folder."""
    items = re.findall(r"^- (.*?)(?=^- |\n\n|\Z)", _section("Layout"), re.S | re.M)
    checked, missing = 0, []
    for item in items:
        folder = re.match(r"`([\w/]+/)`", item)
        if not folder:
            continue
        # The folder, and its sub-folders the item names (`data/`).
        bases = [ROOT / folder.group(1)] + [ROOT / folder.group(1) / sub
                                            for sub in re.findall(r"`(\w+)/`", item)]
        for name in re.findall(r"`(\w+)`", item):
            checked += 1
            if not any((base / f"{name}.py").is_file() or (base / name / "__init__.py").is_file()
                       for base in bases):
                missing.append(f"{folder.group(1)}{name}")
    assert checked > 40, checked
    assert not missing, f"README.md's Layout names modules that do not exist: {missing}"
