"""Loading an export imports no writer and no Keras model code (`nlp.export.load`,
`vision.export.load`).

TensorFlow itself imports Keras when it can (``import tensorflow`` loads
Keras's optimizers), so the fresh process below makes ``import keras`` fail: TensorFlow
goes on without it, and a serving module that imports Keras, itself or through
`tfx_transformer` or a model module, fails to import. The detector is then loaded and run in
that process. Loading a translator needs tensorflow-text, which subclasses Keras 2 layers
and so needs Keras: it is loaded last, with Keras importable again, and no module of this
project may be imported by it either.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Writers and model code: none may be imported by loading an export.
FORBIDDEN = ("keras", "tfx_transformer", "nlp.export.translator", "nlp.modeling.model",
             "nlp.search.decoding", "nlp.search.greedy", "nlp.search.beam", "nlp.search.steps",
             "nlp.text.tokenizer", "nlp.training.train",
             "vision.training", "vision.modeling", "vision.matching", "vision.data")

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np

    FORBIDDEN = {forbidden!r}

    # The packages' registration of their class names (tfx_transformer.registry) imports
    # neither Keras nor model code: it is allowed.
    LIGHT = {{"tfx_transformer", "tfx_transformer.registry"}}

    def loaded(allow=()):
        return sorted(name for name, module in sys.modules.items() if module is not None
                      and any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
                      and name not in LIGHT
                      and not any(name == a or name.startswith(a + ".") for a in allow))

    sys.modules["keras"] = None  # `import keras` raises ModuleNotFoundError from here on
    import nlp.export.load
    import vision.export.load
    report = {{"after_import": loaded()}}
    detector = vision.export.load.load_detector({detector!r})
    out = detector(np.zeros((2, 5, 7, 3), np.uint8))
    report["after_detector"] = loaded()
    report["boxes"] = out["boxes"].tolist()
    del sys.modules["keras"]  # tensorflow-text needs Keras (its layers subclass Keras 2 ones)
    import tensorflow as tf
    translator = nlp.export.load.load_translator({translator!r})
    report["translation"] = [t.decode() for t in translator(tf.constant(["ab", "c"])).numpy()]
    hypotheses, scores = translator.translate_nbest(tf.constant(["ab"]))
    report["nbest"] = [h.decode() for h in hypotheses.numpy()[0]]
    report["after_translator"] = loaded(allow=("keras",))
    print("REPORT " + json.dumps(report))
""")


def _stand_in_translator(path):
    """A SavedModel with the translator's signatures (upper case; 2 hypotheses) and info."""
    spec = tf.TensorSpec([None], tf.string, name="text")
    upper = tf.function(lambda text: {"translation": tf.strings.upper(text)},
                        input_signature=[spec])
    nbest = tf.function(lambda text: {"hypotheses": tf.stack([tf.strings.upper(text), text], 1),
                                      "scores": -tf.ones([tf.shape(text)[0], 2])},
                        input_signature=[spec])
    tf.saved_model.save(tf.Module(), str(path), signatures={
        "serving_default": upper, "greedy": upper, "translate_nbest": nbest})
    (path / "translator.json").write_text(json.dumps({
        "format_version": 2, "beam_size": 2,
        "signatures": {"serving_default": {"beam_size": 2}, "greedy": {"beam_size": 1},
                       "translate_nbest": {"beam_size": 2,
                                           "output_keys": ["hypotheses", "scores"]}},
        "input_key": "text", "output_key": "translation"}))


def _stand_in_detector(path):
    """A SavedModel with the detector's signatures: one box per image, its size in pixels."""
    def detect(images):
        shape = tf.cast(tf.shape(images), tf.float32)
        n = tf.shape(images)[0]
        box = tf.stack([0.0, 0.0, shape[2], shape[1]])
        return {"boxes": tf.tile(box[None, None], [n, 1, 1]), "scores": tf.ones([n, 1]),
                "labels": tf.zeros([n, 1], tf.int32)}

    module = tf.Module()
    tf.saved_model.save(module, str(path), signatures={
        "serving_default": tf.function(detect, input_signature=[
            tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")]),
        "serving_bytes": tf.function(lambda image_bytes: detect(tf.zeros(
            [tf.shape(image_bytes)[0], 1, 1, 3], tf.uint8)), input_signature=[
            tf.TensorSpec([None], tf.string, name="image_bytes")])})
    (path / "classes.json").write_text('{"class_names": ["cat"], "category_ids": null}')


def test_loading_an_export_imports_no_writer_and_no_keras(tmp_path):
    _stand_in_translator(tmp_path / "translator")
    _stand_in_detector(tmp_path / "detector")
    script = SCRIPT.format(forbidden=FORBIDDEN, detector=str(tmp_path / "detector"),
                           translator=str(tmp_path / "translator"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["after_import"] == []
    assert report["after_detector"] == []
    assert report["after_translator"] == []
    # The loaded exports ran: the stand-ins' own results.
    np.testing.assert_array_equal(report["boxes"], [[[0, 0, 7, 5]], [[0, 0, 7, 5]]])
    assert report["translation"] == ["AB", "C"] and report["nbest"] == ["AB", "ab"]
