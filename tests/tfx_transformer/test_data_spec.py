"""Tests of the `--data` spec parser shared by both applications (`training.data_spec`)."""

import os

import pytest

from tfx_transformer.data_spec import DataSpec, normalized, parse_data_spec

SCHEMES = {"embedded": (), "tsv": ("PATH",), "coco": ("IMAGES_DIR", "ANNOTATIONS.json"),
           "tfds": ("NAME",)}


@pytest.mark.parametrize("spec, expected", [
    ("embedded", ("embedded", ())),
    ("tsv:a/b.tsv", ("tsv", ("a/b.tsv",))),
    ("coco:imgs:ann.json", ("coco", ("imgs", "ann.json"))),
    ("coco:imgs:C:/ann.json", ("coco", ("imgs", "C:/ann.json"))),  # the last part: the rest
    ("tfds:coco/2017", ("tfds", ("coco/2017",))),
    ("tfds:wmt14_translate/de-en:1.0.0", ("tfds", ("wmt14_translate/de-en:1.0.0",))),
])
def test_good_specs(spec, expected):
    parsed = parse_data_spec(spec, SCHEMES)
    assert parsed == expected and isinstance(parsed, DataSpec)
    assert str(parsed) == spec


@pytest.mark.parametrize("spec, message", [
    ("csv:/tmp/x.csv", "`--data` has an unknown scheme 'csv'; accepted: 'embedded', "
                       "'tsv:PATH', 'coco:IMAGES_DIR:ANNOTATIONS.json', 'tfds:NAME'. "
                       "Received: --data 'csv:/tmp/x.csv'"),
    ("", "unknown scheme ''"),
    ("embedded:x", "`--data` 'embedded' takes no argument. Received: --data 'embedded:x'"),
    ("embedded:", "takes no argument"),
    ("tsv:", "`--data` must be 'tsv:PATH' here, with no part empty. Received: --data 'tsv:'"),
    ("tsv", "must be 'tsv:PATH'"),
    ("coco:/only/images", "must be 'coco:IMAGES_DIR:ANNOTATIONS.json' here"),
    ("coco::ann.json", "Received: --data 'coco::ann.json'"),
    ("tfds:/2017", "'tfds:NAME[/CONFIG][:VERSION]'"),
    ("tfds:Coco", "Received: --data 'tfds:Coco'"),
    (3, "`--data` must be a string, one of 'embedded', "),
])
def test_bad_specs_name_the_flag_and_the_value(spec, message):
    with pytest.raises(ValueError) as info:
        parse_data_spec(spec, SCHEMES)
    assert message in str(info.value)


def test_normalized_makes_existing_paths_absolute(tmp_path, monkeypatch):
    (tmp_path / "img").mkdir()
    (tmp_path / "ann.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert normalized("coco:img:ann.json") == (
        f"coco:{os.path.join(tmp_path, 'img')}:{os.path.join(tmp_path, 'ann.json')}")
    assert normalized("tsv:missing.tsv") == "tsv:missing.tsv"
    assert normalized("embedded") == "embedded"
    (tmp_path / "coco").mkdir()
    (tmp_path / "coco" / "2017").mkdir()
    assert normalized("tfds:coco/2017") == "tfds:coco/2017"  # a name, never a path
