"""The README's Python example runs as written."""

import pathlib
import re


def test_readme_layer_example_runs():
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(import numpy.*?)```", text, re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert tuple(namespace["logits"].shape) == (1, 3, 1000)
