"""`tfx_transformer.layers` (and `tfx_transformer` itself) import no TensorFlow.

Three checks:
- the sources: no module of `tfx_transformer/layers/`, nor `tfx_transformer/__init__.py` and
  what it re-exports from `tfx_transformer.training`, holds an ``import tensorflow`` anywhere
  (function bodies included), and the layers import nothing of `tfx_transformer` outside
  `tfx_transformer.layers`;
- a Python in which every ``tensorflow`` import raises ImportError, under Keras's ``numpy``
  backend, imports every module and runs a layer (Keras's ``numpy`` backend imports jax, so
  this one skips, saying so, where jax is not installed);
- a Python under the ``tensorflow`` backend (Keras loads TensorFlow itself) in which an import
  of ``tensorflow`` made by a module of `tfx_transformer` raises ImportError imports them all.
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LAYERS = ROOT / "tfx_transformer" / "layers"
# `tfx_transformer/__init__.py` re-exports the layers and `schedules`.
PACKAGE_FILES = [ROOT / "tfx_transformer" / "__init__.py",
                 ROOT / "tfx_transformer" / "training" / "__init__.py",
                 ROOT / "tfx_transformer" / "schedules.py"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


LAYER_FILES = sorted(LAYERS.glob("*.py"))
MODULES = [_module_name(path) for path in LAYER_FILES + PACKAGE_FILES]


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import statement of `path`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _is_tensorflow(module: str) -> bool:
    return module.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras")


def test_the_scan_covers_every_layer_module():
    assert {"attention", "block", "decoder", "encoder", "stack", "testing"} <= {
        path.stem for path in LAYER_FILES}


def test_no_tensorflow_import_in_the_sources():
    bad = [f"{path.relative_to(ROOT)}:{line}: import {module}"
           for path in LAYER_FILES + PACKAGE_FILES
           for line, module in _imports(path) if _is_tensorflow(module)]
    assert not bad, "TensorFlow imported where keras.ops only is allowed:\n" + "\n".join(bad)


def test_layers_import_only_layers_of_this_project():
    bad = [f"{path.relative_to(ROOT)}:{line}: import {module}"
           for path in LAYER_FILES for line, module in _imports(path)
           if module.split(".")[0] == "tfx_transformer"
           # the package root holds pure-Python names only (checks, LAYER_NAMES)
           and module not in ("tfx_transformer", "tfx_transformer.checks")
           and not module.startswith("tfx_transformer.layers")]
    assert not bad, "a layer imports outside tfx_transformer.layers:\n" + "\n".join(bad)


# Run in a fresh Python: argv[1] is "block" (every tensorflow import fails) or "guard" (an
# import of tensorflow by a module of tfx_transformer fails), argv[2] the modules as JSON.
_PROBE = r'''
import builtins, importlib, importlib.abc, json, sys

mode, modules = sys.argv[1], json.loads(sys.argv[2])


def _is_tensorflow(name):
    return name.split(".")[0] in ("tensorflow", "tensorflow_text", "tf_keras")


class BlockTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _is_tensorflow(name):
            raise ImportError(f"TensorFlow is blocked in this test: import {name}")
        return None


if mode == "block":
    sys.meta_path.insert(0, BlockTensorFlow())
else:
    _import = builtins.__import__

    def _guarded(name, globals=None, locals=None, fromlist=(), level=0):
        caller = (globals or {}).get("__name__") or ""
        if level == 0 and _is_tensorflow(name) and caller.split(".")[0] == "tfx_transformer":
            raise ImportError(f"{caller} imports {name}")
        return _import(name, globals, locals, fromlist, level)

    builtins.__import__ = _guarded

import keras

for module in modules:
    importlib.import_module(module)
if mode == "block":
    import numpy as np
    import tfx_transformer as tt

    encoder = tt.TransformerEncoder(1, num_heads=2, hidden_dim=8)
    out = encoder(np.ones((1, 3, 4), "float32"), padding_mask=np.array([[True, True, False]]))
    assert out.shape == (1, 3, 4), out.shape
    loaded = sorted(m for m in sys.modules if _is_tensorflow(m))
    assert not loaded, loaded
print(keras.backend.backend(), len(modules), "modules imported")
'''


def _probe(mode: str, backend: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", _PROBE, mode, json.dumps(MODULES)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="Keras's numpy backend imports jax, which is not installed "
                           "(the optional extra `jax`: pip install -e '.[jax]')")
def test_layers_import_and_run_with_tensorflow_blocked():
    result = _probe("block", "numpy")
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"numpy {len(MODULES)} modules imported" in result.stdout


def test_no_module_of_the_layers_imports_tensorflow_when_imported():
    result = _probe("guard", "tensorflow")
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"tensorflow {len(MODULES)} modules imported" in result.stdout
