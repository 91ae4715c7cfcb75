"""Checking image files before any training: each one decoded once, the result cached.

A file that is missing, not an image, in a format TensorFlow does not read, too large for
PIL's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``), or truncated (a partial
download passes a header check and fails mid-epoch) is named by `check_images` before the
first batch is built. Each file is decoded by `vision.data.decode.decode_image`, the decoder
of the pipeline itself, so a file that passes here decodes in training too; its size is the
displayed size (EXIF orientation applied), the one COCO annotations record.

The results of readable files are cached by path, file size and modification time
(`CACHE_FILE`, in the work directory of a training run): a rerun, which resumes a run,
decodes only files that changed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import warnings
from collections.abc import Iterable
from typing import NamedTuple

import tensorflow as tf

from vision.data.decode import DECODABLE, decode_image

__all__ = ["CACHE_FILE", "CheckedImages", "check_images", "write_cache"]

CACHE_FILE = "image_check.json"


@tf.function(input_signature=[tf.TensorSpec([], tf.string)])
def _displayed_size(data):
    return tf.shape(decode_image(data))[:2]


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _check(path: str) -> tuple[int, int] | str:
    """``(height, width)`` displayed of one file, or why it cannot be used."""
    from PIL import Image, UnidentifiedImageError  # only needed to check files

    if not os.path.isfile(path):
        return "not found"
    try:
        with Image.open(path) as image:
            image_format = image.format
    except Image.DecompressionBombError as error:
        return f"too large ({error})"
    except (UnidentifiedImageError, OSError) as error:
        return f"not a readable image ({error})"
    if image_format not in DECODABLE:
        return f"{image_format} format; supported formats: {', '.join(DECODABLE)}"
    try:
        with open(path, "rb") as f:
            data = f.read()
        height, width = _displayed_size(tf.constant(data)).numpy().tolist()
    except OSError as error:
        return f"not readable ({error.strerror or error})"
    except tf.errors.OpError as error:
        return f"cannot be decoded, truncated or corrupt ({' '.join(error.message.split())})"
    return height, width


def _read_cache(path: str | None) -> dict:
    if path is None or not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f).get("images", {})
        return {key: value for key, value in entries.items() if isinstance(value, list)
                and len(value) == 4 and all(isinstance(v, int) for v in value)}
    except (OSError, ValueError, AttributeError):
        return {}  # a broken cache is decoded again, then rewritten


class CheckedImages(NamedTuple):
    """What `check_images` found.

    Attributes:
        sizes: ``{path: (height, width)}`` of the displayed images that can be used.
        problems: ``{path: reason}`` of the files that cannot be used.
        entries: The cache entries of the usable files (for `write_cache`).
        decoded: Number of files decoded (not found in the cache).
    """

    sizes: dict
    problems: dict
    entries: dict
    decoded: int


def write_cache(cache: str | os.PathLike, checked: CheckedImages) -> None:
    """Writes the usable files of ``checked`` to ``cache`` (atomically), if any was decoded.

    Call it once the run goes on, so that a run stopped by bad input leaves no new file."""
    if not checked.decoded:
        return
    temporary = f"{os.fspath(cache)}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump({"images": checked.entries}, f)
    os.replace(temporary, cache)


def check_images(paths: Iterable[str], *, cache: str | os.PathLike | None = None,
                 progress: bool = True, workers: int | None = None) -> CheckedImages:
    """Decodes every image file (in threads) and returns the sizes and the problems.

    Args:
        paths: Image files.
        cache: A `CACHE_FILE` whose results are used for files of the same size and
            modification time (`write_cache` writes it). None: no cache.
        progress: Show a progress bar while decoding (files found in the cache are not
            decoded again).
        workers: Decoding threads (default: the CPU count, at most 8).

    Returns:
        The `CheckedImages`, each dict in the order of ``paths``.
    """
    from PIL import Image  # only needed to check files

    paths = list(dict.fromkeys(os.fspath(p) for p in paths))
    cache = None if cache is None else os.fspath(cache)
    cached = _read_cache(cache)
    stamps = {path: _stamp(path) for path in paths}
    results: dict[str, tuple[int, int] | str] = {}
    for path in paths:
        entry = cached.get(os.path.abspath(path))
        if entry is not None and stamps[path] is not None and tuple(entry[:2]) == stamps[path]:
            results[path] = (entry[2], entry[3])
    todo = [path for path in paths if path not in results]
    if todo:
        bar = None
        if progress:
            import keras  # only for its progress bar

            print(f"checking {len(todo)} image files ({len(results)} checked before)")
            if sys.stdout.isatty():  # a log file gets the line alone, not the bar's redraws
                bar = keras.utils.Progbar(len(todo), unit_name="image")
        workers = workers or min(8, os.cpu_count() or 1)
        with warnings.catch_warnings(), concurrent.futures.ThreadPoolExecutor(workers) as pool:
            # Images between PIL's limit and twice it only warn there: they are decoded here
            # and shrunk in the pipeline (`vision.data.decode.shrink`).
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            for i, (path, result) in enumerate(zip(todo, pool.map(_check, todo))):
                results[path] = result
                if bar is not None:
                    bar.update(i + 1)
    sizes = {p: r for p, r in ((p, results[p]) for p in paths) if not isinstance(r, str)}
    problems = {p: r for p, r in ((p, results[p]) for p in paths) if isinstance(r, str)}
    entries = {os.path.abspath(p): [*stamps[p], *sizes[p]] for p in sizes}
    return CheckedImages(sizes, problems, entries, len(todo))
