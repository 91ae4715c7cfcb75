"""Reading the files of a transformers model folder, for both applications' converters.

`read_json` reads ``config.json``, ``generation_config.json``, ``preprocessor_config.json``
and the tokenizer files: a JSON object, or one ValueError that names the file.
"""

from __future__ import annotations

import json

__all__ = ["read_json"]


def read_json(path: str) -> dict:
    """The JSON object of the file at ``path``.

    Raises:
        ValueError: the file cannot be read, is not JSON, or holds no object; the message
            starts with ``path``.
    """
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must be a JSON object")
    return value
