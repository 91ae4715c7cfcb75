"""The command-line battery's fixture files (tests/scripts/cli_cases.py has the cases that read
them), written once per test process: the `fx` fixture."""

import io
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from nlp.text.vocabulary import train_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_cases import CATEGORIES, SIZES, coco_box, coco_images, no_boxes, save_export, write_coco  # noqa: E402


def make_fixtures(fx: Path) -> Path:
    """Writes the files the cases read into ``fx``."""
    (fx / "good.tsv").write_text("".join(f"I have {n} red apples.\tIch habe {n} rote Äpfel.\n"
                                         for n in range(40)), encoding="utf-8")
    (fx / "bad_utf8.tsv").write_bytes(b"one\teins\ntwo\tzwei\nthree \xff\tdrei\n")
    (fx / "notab.tsv").write_text("one\teins\nno tab on this line\n", encoding="utf-8")
    (fx / "empty.tsv").write_bytes(b"")
    (fx / "tsvdir").mkdir()
    train_tokenizer(["Der Hund schläft.", "The dog sleeps.", "Wir gehen nach Hause."],
                    fx / "other.model", vocab_size=40)
    (img := fx / "img").mkdir()
    for name, (h, w) in SIZES.items():
        Image.new("RGB", (w, h), (40, 120, 200)).save(img / name)
    (img / "broken.png").write_bytes(b"this is no image")
    jpeg = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(jpeg, format="JPEG")  # most bytes after the header
    for i in range(5):  # partial downloads: the header is whole, the pixels are not
        (img / f"trunc{i}.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    (img / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"".join(  # 900 M pixels, it says
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        for kind, data in ((b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)),
                           (b"IDAT", zlib.compress(b"")), (b"IEND", b""))))
    camera = io.BytesIO()  # a camera's JPEG that PIL reports as MPO (two pictures)
    Image.fromarray(noise).save(camera, format="MPO", save_all=True,
                                append_images=[Image.new("RGB", (64, 48))])
    (img / "camera.jpg").write_bytes(camera.getvalue())
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 64 wide and 48 high, displayed turned: 48 wide, 64 high
    Image.fromarray(noise).save(img / "phone.jpg", format="JPEG", exif=exif)
    (fx / "invalid.json").write_text('{"images": [')
    images = coco_images()
    for name, kwargs in {
        "good": {}, "empty_images": dict(images=[], annotations=[]),
        "bbox_null": dict(annotations=[coco_box(None)]),
        "bbox_nullitem": dict(annotations=[coco_box([None, 0, 4, 4])]),
        "bbox_str": dict(annotations=[coco_box(["a", 0, 4, 4])]),
        "ann_int": dict(annotations=[coco_box([1, 1, 4, 4]), 5]),
        "ann_notlist": dict(annotations=5),
        "gone_image": dict(images=[*images, {"id": 4, "file_name": "gone.png"}]),
        "broken_image": dict(images=[*images, {"id": 4, "file_name": "broken.png"}]),
        "truncated_image": dict(images=[*images, {"id": 4, "file_name": "trunc0.jpg"}]),
        "bomb_image": dict(images=[*images, {"id": 4, "file_name": "bomb.png"}]),
        "bad_images": dict(images=[*images, *({"id": 4 + i, "file_name": f"trunc{i}.jpg"}
                                              for i in range(5))]),
        "size_mismatch": dict(images=[{**images[0], "width": 99}, *images[1:]]),
        "unknown_cat": dict(annotations=[coco_box([1, 1, 4, 4], category_id=42)]),
        "other_ids": dict(annotations=[], categories=[{**c, "id": c["id"] + 3}
                                                      for c in CATEGORIES]),
        "camera": dict(images=[*images, {"id": 4, "file_name": "camera.jpg", "height": 48,
                                         "width": 64}]),
        # The size an annotation tool shows (the image as displayed), not the stored one.
        "phone": dict(images=[*images, {"id": 4, "file_name": "phone.jpg", "height": 64,
                                        "width": 48}]),
    }.items():
        write_coco(fx / f"{name}.json", **kwargs)
    text = (lambda text: {"translation": tf.strings.upper(text)},
            tf.TensorSpec([None], tf.string, name="text"))
    nbest = (lambda t: {"hypotheses": tf.stack([t] * 4, 1), "scores": tf.zeros([tf.size(t), 4])},
             text[1])
    save_export(fx / "translator", "translator.json", {  # as nlp.export.translator writes it
        "format_version": 2, "beam_size": 4, "length_penalty": 0.6, "extra_length": 50,
        "signatures": {"serving_default": {"beam_size": 4}, "greedy": {"beam_size": 1},
                       "translate_nbest": {"beam_size": 4,
                                           "output_keys": ["hypotheses", "scores"]}},
        "input_key": "text", "output_key": "translation", "vocab_size": 40},
        serving_default=text, greedy=text, translate_nbest=nbest)
    save_export(fx / "detector", "classes.json", {"class_names": [c["name"] for c in CATEGORIES],
                                            "category_ids": [1, 2, 3]},
          serving_default=(lambda images: no_boxes(images),
                           tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")),
          serving_bytes=(lambda image_bytes: no_boxes(image_bytes),
                         tf.TensorSpec([None], tf.string, name="image_bytes")))
    for name, source, path, text in (("badinfo", "translator", "translator.json", "{"),
                                     ("badclasses", "detector", "classes.json", "{"),
                                     ("listclasses", "detector", "classes.json", "[]")):
        shutil.copytree(fx / source, fx / name)
        (fx / name / path).write_text(text)
    return fx


@pytest.fixture(scope="session")
def fx(tmp_path_factory):
    return make_fixtures(tmp_path_factory.mktemp("fx"))
