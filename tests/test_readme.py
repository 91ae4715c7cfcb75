"""The README and the pages under docs/: the Python example runs as written, and every path,
dotted name, module of the Layout, link, `make` target, installed command and script flag they
name exists."""

import functools
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
PACKAGES = ("tfx_transformer", "nlp", "vision")
TOP_FOLDERS = PACKAGES + ("scripts", "benchmarks", "experiments", "tests", "docs")
MAX_README_LINES = 200

pages = pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))


def _fences(text: str) -> list[str]:
    """The bodies of the page's fenced code blocks."""
    return re.findall(r"^```[\w-]*\n(.*?)^```", text, re.S | re.M)


def _prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```[\w-]*\n.*?^```", "", text, flags=re.S | re.M)


def _spans(text: str) -> list[str]:
    """The inline code spans outside the fenced blocks (one span may wrap a line)."""
    return re.findall(r"`([^`]+)`", _prose(text))


def _section(page: pathlib.Path, title: str) -> str:
    text = page.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_readme_layer_example_runs():
    text = README.read_text()
    block = re.search(r"```python\n(import numpy.*?)```", text, re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert tuple(namespace["logits"].shape) == (1, 3, 1000)


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move text to docs/")


def test_every_docs_page_is_linked_from_readme():
    assert DOCS, "no pages under docs/"
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README.read_text()))
    missing = sorted(str(page.relative_to(ROOT)) for page in DOCS
                     if str(page.relative_to(ROOT)) not in linked)
    assert not missing, f"README.md does not link these pages: {missing}"


def _paths(text: str) -> set[str]:
    """Repository paths a page names: a code span that is one path, and in code blocks any
    `scripts/NAME.py`-like token under a top folder of the repository."""
    spans = re.findall(r"`([\w./-]+(?:/|\.py))`", text)
    in_blocks = [p for block in _fences(text)
                 for p in re.findall(r"(?<![\w./-])((?:%s)/[\w./-]*\w(?:/|\.py))" %
                                     "|".join(TOP_FOLDERS), block)]
    return {p for p in spans + in_blocks if p.split("/")[0] in TOP_FOLDERS}


@pages
def test_paths_exist(page):
    paths = _paths(page.read_text())
    if page == README:
        assert paths, "no paths found in README.md"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pages
def test_links_resolve(page):
    """Relative links and images resolve from the page's own folder (docs pages: `../`)."""
    prose = re.sub(r"`[^`]+`", "", _prose(page.read_text()))
    targets = re.findall(r"\]\(([^)\s]+)\)", prose)
    local = [t.split("#")[0] for t in targets
             if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    missing = sorted(t for t in local if t and not (page.parent / t).exists())
    assert not missing, f"{page.name} links to what does not exist: {missing}"


def _dotted_names(text: str) -> set[str]:
    return set(re.findall(r"`((?:%s)(?:\.\w+)+)" % "|".join(PACKAGES), text))


def _missing_names(names) -> list[str]:
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
    return missing


def test_pages_name_dotted_names():
    """README.md and the docs name modules and objects by their dotted names (checked below)."""
    assert len(_dotted_names(README.read_text())) > 5
    assert len(set().union(*(_dotted_names(page.read_text()) for page in PAGES))) > 20


@pages
def test_dotted_names_import(page):
    """``nlp.export.translator.load_translator`` and the like: the module imports, the name is in
    it."""
    names = _dotted_names(page.read_text())
    if not names:
        pytest.skip(f"{page.name} names no dotted names")
    missing = _missing_names(names)
    assert not missing, f"{page.name} names what does not exist: {missing}"


# --- The Layout of docs/architecture.md ---

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _layout_items():
    """(folder, the folders its names are looked up in, the bare names) of each Layout item
    that starts with a folder, and the file paths the Layout names in full."""
    section = _section(ARCHITECTURE, "Layout")
    items = re.findall(r"^- (.*?)(?=^- |\n\n|\Z)", section, re.S | re.M)
    result = []
    for item in items:
        folder = re.match(r"`([\w/]+/)`", item)
        if not folder:
            continue
        # The folder, and its sub-folders the item names (`data/`).
        bases = [ROOT / folder.group(1)] + [ROOT / folder.group(1) / sub
                                            for sub in re.findall(r"`(\w+)/`", item)]
        result.append((folder.group(1), bases, re.findall(r"`(\w+)`", item)))
    files = {ROOT / p for p in re.findall(r"`([\w/]+\.py)`", section)}
    return result, files


def _module_files(base: pathlib.Path, name: str) -> list[pathlib.Path]:
    return [f for f in (base / f"{name}.py", base / name / "__init__.py") if f.is_file()]


def test_layout_names_existing_modules():
    """Each bare `name` of a Layout item is a module or package in the item's folder."""
    items, _ = _layout_items()
    checked, missing = 0, []
    for folder, bases, names in items:
        for name in names:
            checked += 1
            if not any(_module_files(base, name) for base in bases):
                missing.append(f"{folder}{name}")
    assert checked > 40, checked
    assert not missing, f"docs/architecture.md's Layout names modules that do not exist: {missing}"


def test_layout_lists_every_module():
    """Every module and sub-package of tfx_transformer, nlp and vision is in the Layout: a
    module by its bare name in its folder's item (or its path), a package as an item's folder
    or a sub-folder an item names (`data/`)."""
    items, named = _layout_items()
    folders = set()
    for _, bases, names in items:
        folders.update(bases)
        named.update(f for name in names for base in bases for f in _module_files(base, name))
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__init__.py":
                if path.parent not in folders and path not in named:
                    missing.append(f"{path.parent.relative_to(ROOT)}/")
            elif path not in named:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"docs/architecture.md's Layout leaves out: {missing}"


# --- Commands: make targets, installed commands and the scripts' flags ---

SCRIPTS = {path.stem for path in (ROOT / "scripts").glob("*.py")}
FLAG = r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*"


def _installed_commands() -> dict[str, str]:
    """``tfx-NAME`` -> the script that runs the same ``main`` (pyproject's [project.scripts])."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    table = pyproject[pyproject.index("[project.scripts]"):]
    table = table[:table.find("\n[", 1)]
    by_module = {}
    for script in SCRIPTS:
        wrapper = (ROOT / "scripts" / f"{script}.py").read_text()
        found = re.search(r"from ([\w.]+) import main", wrapper)
        if found:
            by_module[found.group(1)] = script
    return {command: by_module.get(module) for command, module
            in re.findall(r'^([\w-]+) = "([\w.]+):main"', table, re.M)}


@functools.lru_cache(maxsize=None)
def _all_help_flags() -> dict:
    """SCRIPT -> the flags ``scripts/SCRIPT.py --help`` lists: the ``main`` each script wraps
    (``from MODULE import main``), called in this process with ``--help``."""
    import contextlib
    import io

    found = {}
    for script in sorted(SCRIPTS):
        wrapper = (ROOT / "scripts" / f"{script}.py").read_text()
        module = re.search(r"from ([\w.]+) import main", wrapper).group(1)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
            importlib.import_module(module).main(["--help"])
        assert stop.value.code == 0, f"{script}.py --help exited {stop.value.code}"
        found[script] = frozenset(re.findall(FLAG, out.getvalue()))
    return found


def _help_flags(script: str) -> frozenset:
    return _all_help_flags()[script]


def _command_lines(text: str) -> list[str]:
    """Shell commands of the code blocks (continuations joined, comments dropped) and the code
    spans of the prose."""
    lines = []
    for block in _fences(text):
        for line in block.replace("\\\n", " ").splitlines():
            lines.append(re.sub(r"(^|\s)#.*", "", line))
    return lines + [" ".join(span.split()) for span in _spans(text)]


def _invocations(text: str, commands: dict[str, str]):
    """(script, the flags that follow it) for each `scripts/NAME.py`, `NAME.py` or installed
    `tfx-NAME` with flags in a command line of the page."""
    pattern = re.compile(r"(?<![\w-])(?:scripts/)?(%s)\.py\b|(?<![\w/-])(%s)(?![\w-])" % (
        "|".join(sorted(SCRIPTS)), "|".join(map(re.escape, sorted(commands)))))
    for line in _command_lines(text):
        for command in re.split(r"\||;|&&", line):
            found = pattern.search(command)
            if found:
                script = found.group(1) or commands[found.group(2)]
                yield script, re.findall(FLAG, command[found.end():])


def test_pages_run_scripts_with_flags():
    """The flags test below is not vacuous: README.md runs every script with flags."""
    commands = _installed_commands()
    run = {script for script, flags in _invocations(README.read_text(), commands) if flags}
    assert run == SCRIPTS, sorted(SCRIPTS - run)


@pages
def test_script_flags_exist(page):
    """Each flag after `scripts/NAME.py` (or its installed command) is one `NAME.py --help`
    lists, and each flag a code span starts with is one of some script's."""
    commands = _installed_commands()
    text = page.read_text()
    bad = sorted({f"{script}.py {flag}" for script, flags in _invocations(text, commands)
                  for flag in flags if flag not in _help_flags(script)})
    every = frozenset().union(*(_help_flags(script) for script in sorted(SCRIPTS)))
    loose = sorted({flag for span in _spans(text)
                    for flag in re.findall(r"^(%s)" % FLAG, " ".join(span.split()))
                    if flag not in every})
    assert not bad, f"{page.name} gives scripts flags their --help does not list: {bad}"
    assert not loose, f"{page.name} names flags no script has: {loose}"


@pages
def test_make_targets_and_installed_commands_exist(page):
    text = page.read_text()
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    wanted = {m for line in _command_lines(text) for m in re.findall(r"(?<![\w-])make (\w+)", line)}
    assert not wanted - targets, f"{page.name} runs make targets that do not exist: " \
                                 f"{sorted(wanted - targets)}"
    commands = _installed_commands()
    assert all(commands.values()), commands
    named = {c for line in _command_lines(text)
             for c in re.findall(r"(?<![\w/-])(tfx-[a-z]+(?:-[a-z]+)*)", line)}
    assert not named - set(commands), f"{page.name} names commands that are not installed: " \
                                      f"{sorted(named - set(commands))}"
