"""The installed commands ([project.scripts]) and scripts/NAME.py run the same ``main``.

Each command name maps to ``MODULE:main`` in pyproject.toml; ``scripts/NAME.py`` is a two-line
wrapper of that ``main``, so the README's ``python scripts/...`` lines and the installed names
(``tfx-translate``, ...) behave alike.
"""

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
ROOT = Path(__file__).resolve().parents[2]
# Command name -> the script that runs it from a checkout.
SCRIPTS = {
    "tfx-train-nmt": "train_nmt.py", "tfx-translate": "translate.py",
    "tfx-evaluate-nmt": "evaluate_nmt.py", "tfx-train-detr": "train_detr.py",
    "tfx-detect": "detect.py", "tfx-evaluate-detr": "evaluate_detr.py",
    "tfx-quickstart": "quickstart.py", "tfx-serve": "serve.py",
    "tfx-convert-detr": "convert_detr.py", "tfx-convert-nmt": "convert_nmt.py",
    "tfx-export": "export.py",
}


def _entry_points() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def test_every_command_is_listed():
    assert set(_entry_points()) == set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_command_is_an_importable_main_wrapped_by_its_script(name):
    target = _entry_points()[name]
    module_name, _, function = target.partition(":")
    assert function == "main", target
    main = getattr(importlib.import_module(module_name), "main")
    assert callable(main) and list(inspect.signature(main).parameters) == ["argv"]
    wrapper = (ROOT / "scripts" / SCRIPTS[name]).read_text(encoding="utf-8")
    lines = [line for line in wrapper.splitlines() if line.strip()]
    assert lines == [f"from {module_name} import main", "raise SystemExit(main())"], wrapper


def test_the_commands_of_one_application_never_import_the_other():
    # nlp and vision stay independent; only tfx_transformer.commands.quickstart runs both.
    for package, other in (("nlp", "vision"), ("vision", "nlp")):
        for path in (ROOT / package / "commands").glob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert f"from {other}" not in text and f"import {other}" not in text, path


def test_importing_the_packages_on_the_way_loads_no_tensorflow():
    # What a command imports before its quiet start: TensorFlow must not be among it.
    code = ("import sys, tfx_transformer, tfx_transformer.training, tfx_transformer.quiet"
            ", tfx_transformer.serving, nlp, nlp.commands, vision, vision.commands; "
            "sys.exit('tensorflow' in sys.modules or 'keras' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_training_commands_run_tensorflow_with_onednn_unless_told_otherwise():
    """`onednn_default`: the train commands ask for oneDNN (x86-64) unless the environment
    says otherwise."""
    import os
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("oneDNN is asked for on x86-64 only")
    code = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
            "from tensorflow.python.util import _pywrap_util_port as port; "
            "print(int(port.IsMklEnabled()))")
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"

    def enabled(module, **extra):
        done = subprocess.run([sys.executable, "-c", code, module], cwd=ROOT, text=True,
                              capture_output=True, env={**env, **extra}, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1] == "1"

    assert enabled("vision.commands.train")
    assert not enabled("nlp.commands.train", TF_ENABLE_ONEDNN_OPTS="0")
