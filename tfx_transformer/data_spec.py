"""The ``--data`` specs of both applications: ``scheme`` or ``scheme:PART[:PART]`` (pure Python).

Each application names its schemes and their parts, e.g. ``{"embedded": (), "tsv": ("PATH",),
"tfds": ("NAME",)}``; `parse_data_spec` splits a spec by them and says what is wrong in one
message that names ``--data`` and the value. The last part takes the rest of the spec, colons
included (``tfds:coco/2017:1.1.0`` is the name ``coco/2017:1.1.0``). A ``tfds`` name is
checked to be ``NAME[/CONFIG][:VERSION]`` before TensorFlow Datasets is imported.

`normalized` gives the spec with its existing paths made absolute, so that a run started again
from another directory recognises its data.

Example:
    >>> parse_data_spec("coco:images:train.json", {"coco": ("IMAGES_DIR", "ANNOTATIONS.json")})
    DataSpec(scheme='coco', parts=('images', 'train.json'))
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["DataSpec", "normalized", "parse_data_spec"]

# TensorFlow Datasets' "name[/config][:version]", e.g. "coco/2017" or "mnist:3.0.1".
_TFDS_NAME = re.compile(r"[a-z][a-z0-9_]*(/[\w.+-]+)?(:[\w.*]+)?")


class DataSpec(NamedTuple):
    """A parsed ``--data`` spec: its ``scheme`` and its ``parts`` (paths, a dataset name);
    ``scheme, parts = spec`` unpacks it."""

    scheme: str
    parts: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ":".join((self.scheme, *self.parts))


def _form(scheme: str, parts: Sequence[str]) -> str:
    return ":".join((scheme, *parts))


def parse_data_spec(spec, schemes: Mapping[str, Sequence[str]]) -> DataSpec:
    """Splits ``spec`` into its scheme and the parts that scheme takes.

    Args:
        spec: e.g. ``"embedded"``, ``"tsv:PATH"``.
        schemes: each accepted scheme -> the names of its parts, in order (``()``: none).

    Returns:
        The `DataSpec`: ``parts`` has one non-empty string per name of its scheme.

    Raises:
        ValueError: ``spec`` is not a string, its scheme is unknown (the message lists the
            accepted forms), or its parts are missing, empty or not expected.
    """
    received = f"Received: --data {spec!r}"
    accepted = ", ".join(repr(_form(name, parts)) for name, parts in schemes.items())
    if not isinstance(spec, str):
        raise ValueError(f"`--data` must be a string, one of {accepted}. {received}")
    scheme, colon, rest = spec.partition(":")
    if scheme not in schemes:
        raise ValueError(f"`--data` has an unknown scheme {scheme!r}; accepted: {accepted}. "
                         f"{received}")
    names = tuple(schemes[scheme])
    form = _form(scheme, names)
    if not names:
        if colon:
            raise ValueError(f"`--data` {scheme!r} takes no argument. {received}")
        return DataSpec(scheme)
    parts = tuple(rest.split(":", len(names) - 1)) if colon else ()
    if len(parts) != len(names) or not all(parts):
        raise ValueError(f"`--data` must be {form!r} here, with no part empty. {received}")
    if scheme == "tfds" and not _TFDS_NAME.fullmatch(parts[-1]):
        raise ValueError(f"`--data` must be 'tfds:NAME[/CONFIG][:VERSION]' with a TensorFlow "
                         f"Datasets name such as 'coco/2017'. {received}")
    return DataSpec(scheme, parts)


def normalized(spec: str) -> str:
    """``spec`` with each part that is an existing path made absolute (the same data given by
    another relative path is the same data); ``tfds:`` names and other parts are kept as
    they are.

    Example:
        >>> normalized("tsv:pairs.tsv")  # run where pairs.tsv exists
        'tsv:/home/me/pairs.tsv'
    """
    scheme, *parts = str(spec).split(":")
    if scheme == "tfds":
        return str(spec)
    return ":".join([scheme, *(os.path.abspath(p) if p and os.path.exists(p) else p
                               for p in parts)])
