"""Decoding speed of an exported translator: beam search against greedy search and against
decoding without the KV cache, over 500 held-out sentences.

    python experiments/nmt_decode.py [--workdir runs/nmt_decode] [--repeats 3] [--batch-size 64]
    python experiments/nmt_decode.py --export DIR/export [--pairs TSV] [--limit 500]

Without ``--export``, trains the tiny preset once (``scripts/train_nmt.py --data embedded
--preset tiny --max-steps 300 --workdir WORKDIR``, about 3 minutes on 2 cores; reused while
``WORKDIR/export`` exists) and translates the 500 held-out pairs of the embedded data, as
``scripts/evaluate_nmt.py --data embedded`` does. With ``--pairs``, the first column of a TSV
file (at most ``--limit`` lines).

Every case translates all the sentences as ``nlp.training.evaluate.translate_all`` does (batches of
``--batch-size`` sentences of similar length, the order restored), after two warm-up batches
of different shapes; the cases alternate, and each time is the median over ``--repeats``:

* ``beam``, ``greedy``, ``nbest``: the SavedModel's ``serving_default``, ``greedy`` and
  ``translate_nbest`` signatures (``nbest`` only in exports that have it);
* ``beam, input order``: ``serving_default`` on batches in input order (no length sorting);
* ``beam/greedy in process``: the same weights (read from the SavedModel) in this process,
  ``nlp.search.decoding.beam_search`` / ``greedy_search`` in one ``tf.function``, and
  ``beam/greedy uncached``: the same with ``beam_search_uncached`` / ``greedy_search_uncached``
  (the decoder re-run over the whole prefix at every step). These need the export's work
  directory (``DIR/..``: ``metrics.json`` with the model's config, ``tokenizer.model``);
* ``beam, XLA export`` (``--xla``): the model exported again with ``jit_compile=True``,
  whose first pass compiles every batch shape (reported apart as ``first pass``).

Prints, per case, ms per sentence and seconds per pass, in wall-clock time and in this
process's CPU time (all threads: steadier than wall time on a shared machine, whose load
``uptime`` shows), and the ratios of both; JSON last. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from nlp.data.sources import evaluation_split, load_pairs, read_tsv  # noqa: E402
from nlp.export.load import load_translator, read_info  # noqa: E402
from nlp.export.translator import export_translator  # noqa: E402
from nlp.search import decoding  # noqa: E402
from nlp.training.evaluate import translate_all  # noqa: E402

TRAIN_STEPS = 300


def train(workdir: Path) -> Path:
    """``WORKDIR/export`` of the tiny preset trained for `TRAIN_STEPS` steps (once)."""
    export = workdir / "export"
    if not (export / "saved_model.pb").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "train_nmt.py"), "--data",
                        "embedded", "--preset", "tiny", "--max-steps", str(TRAIN_STEPS),
                        "--workdir", str(workdir)], check=True)
    return export


def in_process_model(export: Path):
    """The exported model rebuilt from its work directory's config, with the export's weights
    (the SavedModel tracks the model's variables in their order); ``None`` without a work
    directory."""
    metrics, tokenizer_file = export.parent / "metrics.json", export.parent / "tokenizer.model"
    if not (metrics.is_file() and tokenizer_file.is_file()):
        return None
    from nlp.modeling.model import Seq2SeqTransformer
    from nlp.text.tokenizer import Tokenizer

    config = json.loads(metrics.read_text(encoding="utf-8"))["config"]
    names = ("vocab_size", "num_encoder_layers", "num_decoder_layers", "d_model", "num_heads",
             "ffn_dim", "dropout", "activation_dropout", "max_positions", "norm_first",
             "tie_embeddings")  # (dropout: its seed variables; decoding applies none)
    config = {**config, "vocab_size": config.get("tokenizer_vocab_size", config["vocab_size"])}
    model = Seq2SeqTransformer(**{name: config[name] for name in names})
    saved = tf.saved_model.load(str(export)).variables
    if len(saved) != len(model.variables) or any(
            tuple(a.shape) != tuple(b.shape) for a, b in zip(model.variables, saved)):
        raise SystemExit(f"error: the variables of {export} do not fit its config {metrics}")
    for variable, value in zip(model.variables, saved):
        variable.assign(value)
    return model, Tokenizer.from_file(tokenizer_file)


def search_fn(model, tokenizer, method: str, **kwargs):
    """``text (N,) -> (N,)`` as the export translates (truncation, eos, padding), decoding with
    ``nlp.search.decoding``'s ``method`` in one ``tf.function``."""
    searches = {"beam": decoding.beam_search, "beam_uncached": decoding.beam_search_uncached,
                "greedy": decoding.greedy_search,
                "greedy_uncached": decoding.greedy_search_uncached}
    longest = model.max_positions - kwargs.get("extra_length", 50) - 16

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def translate(text):
        ids = tokenizer.tokenize(text)[:, : longest - 1]
        eos = tf.fill([tf.shape(text)[0], 1], tokenizer.eos_id)
        source = tf.concat([ids, eos], axis=1).to_tensor(default_value=tokenizer.pad_id)
        return tokenizer.detokenize(searches[method](model, source, **kwargs))

    return translate


def in_input_order(translate, sources, batch_size):
    """``translate_all`` without the length sorting: batches in input order."""
    out = []
    for start in range(0, len(sources), batch_size):
        out += [t.decode("utf-8") for t in
                translate(tf.constant(sources[start:start + batch_size])).numpy()]
    return out


def nbest_first(translate_nbest):
    """``text -> the first hypothesis of each n-best list``."""
    return lambda text: translate_nbest(text)[0][:, 0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "nmt_decode"),
                        help="where the tiny model is trained (without --export)")
    parser.add_argument("--export", help="an export directory instead of training one")
    parser.add_argument("--pairs", help="a TSV file whose first column is translated")
    parser.add_argument("--limit", type=int, default=500, help="sentences translated")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--xla", action="store_true", help="also time an XLA-compiled export")
    parser.add_argument("--skip", default="", help="comma-separated case names not to run")
    args = parser.parse_args(argv)

    export = Path(args.export) if args.export else train(Path(args.workdir))
    if args.pairs:
        sources = [s for s, _ in read_tsv(args.pairs)][: args.limit]
    else:
        sources = [s for s, _ in load_pairs("embedded", evaluation_split("embedded"),
                                            limit=args.limit)]
    info = read_info(export)
    translator = load_translator(export)
    kw = dict(beam_size=info["beam_size"], length_penalty=info["length_penalty"],
              extra_length=info["extra_length"])
    # name -> (text (N,) -> (N,) translations, batches sorted by length)
    cases = {"beam": (translator, True), "greedy": (load_translator(export, beam_size=1), True),
             "nbest": (nbest_first(translator.translate_nbest), True),
             "beam, input order": (translator, False)}
    rebuilt = in_process_model(export)
    if rebuilt is not None:
        model, tokenizer = rebuilt
        greedy_kw = dict(extra_length=kw["extra_length"])
        for name, method, kwargs in (("beam in process", "beam", kw),
                                     ("beam uncached", "beam_uncached", kw),
                                     ("greedy in process", "greedy", greedy_kw),
                                     ("greedy uncached", "greedy_uncached", greedy_kw)):
            cases[name] = (search_fn(model, tokenizer, method, **kwargs), True)
        if args.xla:
            from nlp.search.decoding import DecodingSettings

            xla_dir = Path(tempfile.mkdtemp(prefix="nmt_decode_xla_")) / "export"
            export_translator(model, tokenizer, xla_dir, DecodingSettings(**kw),
                              jit_compile=True)
            cases["beam, XLA export"] = (load_translator(xla_dir), True)
    else:
        print(f"(no work directory beside {export}: no in-process and uncached cases)")
    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    cases = {name: case for name, case in cases.items() if name not in skip}

    def run(name):
        translate, by_length = cases[name]
        if by_length:
            return translate_all(translate, sources, args.batch_size, progress=False)
        return in_input_order(translate, sources, args.batch_size)

    print(f"{len(sources)} sentences, batches of {args.batch_size}, beam {kw['beam_size']}; "
          f"{export}; {platform.machine()}, {os.cpu_count()} CPUs, TensorFlow {tf.__version__}")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    order = np.argsort([len(s) for s in sources], kind="stable")
    warm = [[sources[i] for i in order[:8]], [sources[i] for i in order[-9:]]]
    first, outputs = {}, {}
    for name, (translate, _) in cases.items():
        if name != "beam, XLA export":  # (its first pass compiles every shape: timed below)
            for texts in warm:  # traces a tf.function for two shapes, then for any
                translate(tf.constant(texts))
        start = time.perf_counter()
        outputs[name] = run(name)
        first[name] = time.perf_counter() - start
    times = {name: [] for name in cases}  # (wall s, CPU s) per pass
    for _ in range(args.repeats):
        for name in cases:
            start, cpu = time.perf_counter(), time.process_time()
            run(name)
            times[name].append((time.perf_counter() - start, time.process_time() - cpu))
    median = {name: statistics.median(w for w, _ in t) for name, t in times.items()}
    median_cpu = {name: statistics.median(c for _, c in t) for name, t in times.items()}

    same = {name: outputs[name] == outputs[reference]
            for name, reference in (("nbest", "beam"), ("beam, input order", "beam"),
                                    ("beam in process", "beam"), ("beam uncached", "beam"),
                                    ("greedy in process", "greedy"),
                                    ("greedy uncached", "greedy"), ("beam, XLA export", "beam"))
            if name in outputs and reference in outputs}
    print(f"{'case':<20} {'ms/sentence':>11} {'s/pass':>7} {'CPU ms/sent':>11} "
          f"{'CPU s/pass':>10} {'1st pass s':>10}  same translations as")
    for name in cases:
        print(f"{name:<20} {1000 * median[name] / len(sources):>11.2f} {median[name]:>7.2f} "
              f"{1000 * median_cpu[name] / len(sources):>11.2f} {median_cpu[name]:>10.2f} "
              f"{first[name]:>10.2f}  {same.get(name, '')}")
    ratios, cpu_ratios = {}, {}
    for a, b in (("beam", "greedy"), ("nbest", "beam"), ("beam, input order", "beam"),
                 ("beam in process", "beam"), ("beam uncached", "beam in process"),
                 ("greedy uncached", "greedy in process"), ("beam, XLA export", "beam")):
        if a in times and b in times:
            for out, k in ((ratios, 0), (cpu_ratios, 1)):
                out[f"{a} / {b}"] = round(statistics.median(
                    [x[k] / y[k] for x, y in zip(times[a], times[b])]), 2)
    for name in ratios:
        print(f"ratio {name}: {ratios[name]} (CPU {cpu_ratios[name]})")
    print(json.dumps({"sentences": len(sources), "batch_size": args.batch_size,
                      "seconds": {k: round(v, 3) for k, v in median.items()},
                      "cpu_seconds": {k: round(v, 3) for k, v in median_cpu.items()},
                      "first_pass_seconds": {k: round(v, 3) for k, v in first.items()},
                      "ratios": ratios, "cpu_ratios": cpu_ratios, "same_output": same}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
