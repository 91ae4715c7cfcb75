"""`tfx_transformer.registry`: importing a package lets Keras load every class it saves.

The packages name those classes in tables (`tfx_transformer`, `nlp`, `vision`); here every
module of the three is imported and what Keras then holds must be exactly the tables: a class
registered in a module but missing from its package's table would not load after a plain
``import nlp``. The loads themselves (a run's ``model.keras`` in a process that imports only
the package and Keras) are tested with the runs: tests/scripts/test_model_file.py.
"""

import importlib
import json
import pkgutil
import subprocess
import sys

import keras
import pytest

import nlp
import tfx_transformer
import vision
from tfx_transformer import registry


def test_the_tables_name_every_class_the_packages_register():
    packages = (tfx_transformer, nlp, vision)
    for package in packages:
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)
    registered = {name: f"{found.__module__}" for name, found in
                  keras.saving.get_custom_objects().items()
                  if name.split(">")[0] in {p.__name__ for p in packages}}
    assert not [n for n, found in keras.saving.get_custom_objects().items()
                if isinstance(found, registry._Deferred) and n in registered]
    assert registered == registry._NAMES


_CHILD = """
import json, sys
import nlp, keras
stand_in = keras.saving.get_custom_objects()["nlp>Seq2SeqTransformer"]
before = "nlp.modeling.model" in sys.modules
rebuilt = keras.saving.deserialize_keras_object(json.loads(sys.argv[1]))
print(json.dumps({"before": before, "stand_in": repr(stand_in), "type": type(rebuilt).__module__
                  + "." + type(rebuilt).__name__, "config": rebuilt.get_config()}))
"""


def test_a_stand_in_imports_its_module_when_keras_first_uses_it():
    from nlp.modeling.model import Seq2SeqTransformer

    model = Seq2SeqTransformer(vocab_size=11, num_encoder_layers=1, num_decoder_layers=1,
                               d_model=8, num_heads=2, ffn_dim=16, max_positions=16)
    config = keras.saving.serialize_keras_object(model)
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(config)],
                          capture_output=True, text=True, check=True)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["before"] is False
    assert report["stand_in"] == ("<nlp>Seq2SeqTransformer, registered when nlp.modeling.model "
                                  "is imported>")
    assert report["type"] == "nlp.modeling.model.Seq2SeqTransformer"
    assert report["config"] == json.loads(json.dumps(model.get_config()))


def test_a_name_its_module_does_not_register_is_named():
    with pytest.raises(LookupError, match="nlp.modeling.model does not register 'nlp>Nothing'"):
        registry._Deferred("nlp>Nothing", "nlp.modeling.model").resolve()
