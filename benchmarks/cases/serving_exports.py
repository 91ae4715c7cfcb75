"""The exports the ``serving`` case serves, made once in its work directory and reused.

``trained``: ``scripts/quickstart.py --minutes M`` (the tiny translator and the tiny detector
trained on their embedded data, ``make demo``'s exports). ``random``: a small translator
(1 + 1 layers, d_model 32, a 200-piece vocabulary, beam 3) and a small detector (the tiny
preset at hidden 32, 6 queries, 48 px images) at random weights, exported by
``nlp.export.translator.export_translator`` and ``vision.export.saved_model.export_detector``
as the test suite's exports are, each in its own child process, both at once. The children
keep TensorFlow out of the load generator:

    python benchmarks/cases/serving_exports.py translator|detector|trained FOLDER [MINUTES]
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import sys

import workers

DONE = ".complete"
DETECTOR_NAMES = ("circle", "square", "triangle")


def random_translator(folder: pathlib.Path) -> None:
    import keras

    from nlp.data.embedded import generate_pairs
    from nlp.export.translator import export_translator
    from nlp.modeling.model import Seq2SeqTransformer
    from nlp.search.decoding import DecodingSettings
    from nlp.text.tokenizer import Tokenizer
    from nlp.text.vocabulary import train_tokenizer

    pairs = generate_pairs(200)
    tokenizer = Tokenizer.from_file(train_tokenizer(
        [t for p in pairs for t in p], str(folder / "tok.model"), vocab_size=200))
    keras.utils.set_random_seed(1)
    model = Seq2SeqTransformer(vocab_size=tokenizer.vocab_size, num_encoder_layers=1,
                               num_decoder_layers=1, d_model=32, num_heads=4, ffn_dim=64,
                               dropout=0.0, max_positions=128)
    export_translator(model, tokenizer, folder / "nmt" / "export",
                      DecodingSettings(beam_size=3, length_penalty=0.6, extra_length=6))


def random_detector(folder: pathlib.Path) -> None:
    import keras

    from vision.config import preset
    from vision.export.saved_model import export_detector
    from vision.modeling.detr import build_model

    config = preset("tiny", hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6,
                    tiny_filters=(8, 16, 16, 32), num_encoder_layers=1, num_decoder_layers=2)
    keras.utils.set_random_seed(1234)
    export_detector(build_model(config, len(DETECTOR_NAMES)), folder / "detr" / "export",
                    DETECTOR_NAMES, 48, 64)


def trained_exports(folder: pathlib.Path, minutes: float) -> None:
    subprocess.run([sys.executable, str(workers.ROOT / "scripts" / "quickstart.py"),
                    "--minutes", str(minutes), "--workdir", str(folder)], check=True,
                    cwd=workers.ROOT, stdout=sys.stderr)


def exports(kind: str, folder: pathlib.Path, minutes: float = 8.0,
            log: pathlib.Path | None = None) -> dict[str, str]:
    """``{"translator": DIR, "detector": DIR}`` in ``folder``, built there the first time."""
    if not (folder / DONE).exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        parts = ("translator", "detector") if kind == "random" else (kind,)

        def build(part: str) -> dict:
            return workers.run_once([workers.PY, __file__, part, str(folder), str(minutes)],
                                    log=log and log.with_name(f"{log.stem}-{part}.log"))

        with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:
            list(pool.map(build, parts))
        (folder / DONE).touch()
    return {"translator": str(folder / "nmt" / "export"),
            "detector": str(folder / "detr" / "export")}


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    target = pathlib.Path(sys.argv[2])
    if sys.argv[1] == "translator":
        random_translator(target)
    elif sys.argv[1] == "detector":
        random_detector(target)
    else:
        trained_exports(target, float(sys.argv[3]))
    workers.emit({"folder": str(target)})
