"""The translator as a CTranslate2 model against its SavedModel: identical translations, BLEU,
speed and size, on the first ``sentences`` held-out sentences of the embedded data (the
``formats`` case's translator part; a child process of `cases.formats`).

The run (a ``train_nmt.py`` work directory, or at ``tiny`` a small untrained one built here
with `nlp.export.translator.export_translator`) is written as CTranslate2 float32 and int8
(`nlp.export.ctranslate2.write`, what ``tfx-export --format ctranslate2`` runs), and the
sentences translated by:

* ``SavedModel``: the export's ``serving_default`` (beam search as exported), batches of
  ``batch_size`` sentences of similar length (`nlp.training.evaluate.translate_all`);
* ``CT2 float32``, ``CT2 int8``: `nlp.export.ctranslate2_runtime.Ct2Translator`;
* ``CT2 float32, patience 1``: CTranslate2's beam patience 1 instead of the export's (2 for
  GNMT: it searches until twice the beam's width of hypotheses finished);
* ``CT2 float32, CTranslate2's length penalty`` (not timed): its own ``n ** α`` ranking
  instead of GNMT's, what rescoring in `nlp.export.ctranslate2_runtime` changes.

Rows: per CTranslate2 system the share of sentences whose translation is the SavedModel's and
sacrebleu's corpus BLEU against the references (the SavedModel's BLEU is a row); the seconds
of a pass over all sentences, wall and CPU of this process (steadier on a shared machine),
ours = the CTranslate2 system, peer = the SavedModel, alternating (`harness.alternate`,
``translator_repeats`` rounds after the first pass of each, which gives the translations),
with output tokens per second (SentencePiece pieces of the system's own translations plus eos)
in ``extra``; sizes on disk. ``threads`` threads for TensorFlow and CTranslate2.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys
import time

import harness
import workers

TIMED = ("CT2 float32", "CT2 float32, patience 1", "CT2 int8")
LENGTH_PENALTY = "CT2 float32, CTranslate2's length penalty"


def _random_translator(root: pathlib.Path) -> None:
    """A small untrained translator as a work directory (tokenizer.model, model.keras,
    export/), its tokenizer trained on 200 embedded pairs; beam 4, GNMT length penalty 0.6."""
    import keras

    from nlp.data.sources import load_pairs
    from nlp.export.translator import export_translator
    from nlp.modeling.model import Seq2SeqTransformer
    from nlp.search.decoding import DecodingSettings
    from nlp.text.tokenizer import TOKENIZER_FILE, Tokenizer
    from nlp.text.vocabulary import train_tokenizer

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    pairs = load_pairs("embedded", "train", limit=200)
    tokenizer = Tokenizer.from_file(train_tokenizer(
        [text for pair in pairs for text in pair], str(root / TOKENIZER_FILE), vocab_size=200))
    keras.utils.set_random_seed(1)
    model = Seq2SeqTransformer(vocab_size=tokenizer.vocab_size, num_encoder_layers=1,
                               num_decoder_layers=1, d_model=32, num_heads=4, ffn_dim=64,
                               dropout=0.0, max_positions=128)
    model.save(root / "model.keras")
    export_translator(model, tokenizer, root / "export",
                      DecodingSettings(beam_size=4, length_penalty=0.6, extra_length=8))


def _megabytes(path: pathlib.Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def translator_rows(size: dict, run_dir: str, scratch: str) -> list[harness.Row]:
    """The translator's rows (see the module's docstring)."""
    from cases.formats import set_threads

    threads = size["threads"]
    set_threads(threads)
    import sacrebleu

    from nlp.data.sources import evaluation_split, load_pairs
    from nlp.export import ctranslate2
    from nlp.export.ctranslate2_runtime import Ct2Translator
    from nlp.export.load import load_translator
    from nlp.text.tokenizer import TOKENIZER_FILE, Tokenizer
    from nlp.training.evaluate import translate_all

    workdir = pathlib.Path(run_dir)
    if size["translator"] == "random":
        _random_translator(workdir)
    pairs = load_pairs("embedded", evaluation_split("embedded"), limit=size["sentences"])
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    out = pathlib.Path(scratch) / "translator-ct2"
    shutil.rmtree(out, ignore_errors=True)
    dirs = {precision: out / precision for precision in ("float32", "int8")}
    for precision, path in dirs.items():
        ctranslate2.write(workdir, path, precision, None)
    saved = load_translator(workdir / "export")
    batch = size["batch_size"]
    ct2 = {"CT2 float32": Ct2Translator(dirs["float32"], threads=threads),
           "CT2 float32, patience 1": Ct2Translator(dirs["float32"], threads=threads,
                                                    patience=1.0),
           "CT2 int8": Ct2Translator(dirs["int8"], threads=threads)}
    systems = {"SavedModel": lambda: translate_all(saved, sources, batch, progress=False)}
    for name, translator in ct2.items():
        systems[name] = lambda t=translator: t.translate(sources, batch_size=batch)
    outputs = {name: run() for name, run in systems.items()}  # also the warm-up pass
    plain = Ct2Translator(dirs["float32"], threads=threads)
    plain.settings = {**plain.settings, "convention": "transformers"}  # ranks by n ** α
    outputs[LENGTH_PENALTY] = plain.translate(sources, batch_size=batch)

    cpu = {name: [] for name in systems}  # CPU seconds of this process, per round

    def timed(name: str):
        def one() -> float:
            start, start_cpu = time.perf_counter(), time.process_time()
            systems[name]()
            cpu[name].append(time.process_time() - start_cpu)
            return time.perf_counter() - start
        return one

    wall = harness.alternate({name: timed(name) for name in systems},
                             size["translator_repeats"], warmup=0)
    tokenizer = Tokenizer.from_file(workdir / TOKENIZER_FILE)
    tokens = {name: sum(len(tokenizer.encode(h)) + 1 for h in outputs[name]) for name in wall}
    decoding = json.loads((dirs["float32"] / "settings.json").read_text())
    settings = {"sentences": len(sources), "batch_size": batch, "threads": threads,
                **{key: decoding[key] for key in ("beam_size", "length_penalty", "convention",
                                                  "patience")}}
    base_bleu = sacrebleu.corpus_bleu(outputs["SavedModel"], [references]).score
    saved_size = _megabytes(workdir / "export")
    rows = [harness.Row("translator SavedModel: BLEU", ours=base_bleu, unit="BLEU",
                        settings=settings),
            harness.Row("translator SavedModel: size", ours=saved_size, unit="MB")]
    for name in (*TIMED, LENGTH_PENALTY):
        identical = sum(a == b for a, b in zip(outputs[name], outputs["SavedModel"]))
        bleu = sacrebleu.corpus_bleu(outputs[name], [references]).score
        rows += [harness.Row(f"translator {name}: identical to SavedModel", unit="%",
                             ours=100 * identical / len(sources), settings=settings),
                 harness.Row(f"translator {name}: BLEU", ours=bleu, unit="BLEU",
                             settings=settings, extra={"SavedModel BLEU": base_bleu})]
    for name in TIMED:
        for kind, times in (("wall", wall), ("CPU", cpu)):
            row = harness.compare(f"translator {name}: {len(sources)} sentences, {kind}",
                                  times, ours=name, peer="SavedModel", unit="s",
                                  settings=settings)
            row.extra = {f"tokens per {kind} s": tokens[name] / row.ours,
                         f"SavedModel tokens per {kind} s": tokens["SavedModel"] / row.peer}
            rows.append(row)
    for precision, path in dirs.items():
        rows.append(harness.Row(f"translator CT2 {precision}: size", ours=_megabytes(path),
                                unit="MB", extra={"share of the SavedModel":
                                                  _megabytes(path) / saved_size}))
    return rows


if __name__ == "__main__":
    payload = json.loads(sys.argv[1])
    workers.emit({"rows": [row.to_json() for row in translator_rows(**payload)]})
