"""Translating with a CTranslate2 model directory written by `nlp.export.ctranslate2.write`.

`Ct2Translator` tokenizes with SentencePiece, decodes with ``ctranslate2.Translator`` and
picks the translation as this project's export does (`nlp.search.decoding`), as closely as
CTranslate2's options allow. It needs only ``ctranslate2`` and ``sentencepiece`` (no
TensorFlow). How the search is set:

* each sentence decodes at most its source length (eos included) + ``extra_length`` tokens,
  eos included: sentences are grouped by that limit and each group gets
  ``max_decoding_length = limit - 1`` (CTranslate2 ends every beam at its last step; here the
  last step may only be eos, so a beam cut there is ours with eos added);
* ``min_decoding_length=0`` (an empty translation is allowed, as here), the banned ids
  suppressed (``suppress_sequences``): CTranslate2 removes them before its softmax, which is
  ``renormalize=True``;
* ``return_end_token=True``, so that CTranslate2's length counts eos as ours does;
* beam search returns every finished hypothesis (``num_hypotheses = beam_size *
  patience``), and each is rescored with our length penalty: GNMT's ``((5 + n) / 6) ** α``
  (``convention="gnmt"``; CTranslate2 knows only ``n ** α``) or ``n ** α``
  (``"transformers"``); the best is the translation.

What still differs: CTranslate2 stops a sentence once ``beam_size * patience`` hypotheses
have finished. Our GNMT search goes on until no live hypothesis can beat the best finished
one, and transformers' until the best live one cannot beat the K-th finished at its current
length; a hypothesis that finishes later than CTranslate2 stops is missed, hence a
patience above 1 (`nlp.export.ctranslate2.PATIENCE`, stored in ``settings.json``). With
``renormalize=False`` (transformers' default ``renormalize_logits``) the log-probabilities
here are still normalized after the banned ids are removed. And CTranslate2 translates an
empty source (eos alone) to an empty string without running the model, which a trained model
does too, but not every model. ``experiments/README.md`` has how often translations differ.

An NLLB-200 / M2M100 directory (``tokenizer`` ``nllb``) is run as CTranslate2's users run
one: every source starts with its ``source_lang`` token and every translation with the
``target_lang`` prefix (``target_prefix``), whose log-probability CTranslate2 leaves out and
which counts in the length, as transformers' forced first token does.
"""

from __future__ import annotations

import json
import os
import re

__all__ = ["Ct2Translator", "TextCodec", "is_ct2_dir", "read_settings"]

# nlp.export.ctranslate2.SETTINGS_FILE (not imported here: it imports TensorFlow)
SETTINGS_FILE = "settings.json"
_CODE = re.compile(r">>.*?<<", re.DOTALL)  # a Marian language code at the start of a source
_SPACE = "\u2581"


def is_ct2_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a CTranslate2 model directory written by
    `nlp.export.ctranslate2.write`."""
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, "model.bin")) and \
        os.path.isfile(os.path.join(path, SETTINGS_FILE))


def read_settings(path: str | os.PathLike) -> dict:
    """The ``settings.json`` of a CTranslate2 model directory."""
    with open(os.path.join(os.fspath(path), SETTINGS_FILE), encoding="utf-8") as f:
        settings = json.load(f)
    if settings.get("format") != "ctranslate2":
        raise ValueError(f"{path}/{SETTINGS_FILE}: not a CTranslate2 translator's settings")
    return settings


_FILES = {"marian": ("source.spm", "target.spm"), "nllb": ("sentencepiece.bpe.model",) * 2}


class TextCodec:
    """Text to source pieces and target pieces to text, as the export's tokenizer does.

    Args:
        path: the CTranslate2 model directory (its SentencePiece model files).
        settings: its ``settings.json``: ``tokenizer`` (``sentencepiece``: this project's
            ``tokenizer.model``; ``marian``: OPUS-MT's ``source.spm`` and ``target.spm``;
            ``nllb``: NLLB's ``sentencepiece.bpe.model``, with ``source_lang``) and
            ``special_tokens``.
    """

    def __init__(self, path: str | os.PathLike, settings: dict):
        import sentencepiece as spm

        self.kind = settings["tokenizer"]
        self.marian = self.kind == "marian"
        names = _FILES.get(self.kind, ("tokenizer.model",) * 2)
        self.source_spm, self.target_spm = (
            spm.SentencePieceProcessor(model_file=os.path.join(os.fspath(path), name))
            for name in names)
        special = settings["special_tokens"]
        self.dropped = {special["eos"], special["unk"], *special["banned"]}
        self.prefix = [settings["source_lang"]] if self.kind == "nllb" else []
        if self.kind == "nllb":  # what NllbTokenizer.decode keeps: SentencePiece's pieces
            self.pieces = {self.target_spm.id_to_piece(i)
                           for i in range(3, self.target_spm.get_piece_size())}

    def tokenize(self, text: str) -> list[str]:
        """A source string → its pieces (no eos), as the export's tokenizer splits it."""
        code = []
        if self.marian and text.startswith(">>"):
            found = _CODE.match(text)
            if found:
                code, text = [found.group(0)], text[found.end():]
        pieces = self.source_spm.encode(text, out_type=str)
        # NLLB (`nlp.text.nllb_tokenizer`): a text whose normalized form ends in whitespace keeps
        # it as one more piece; a letter after it would start a word of its own.
        if self.kind == "nllb" and self.source_spm.normalize(f"a{text}x").endswith(_SPACE + "x"):
            pieces.append(_SPACE)
        return self.prefix + code + pieces

    def detokenize(self, tokens: list[str]) -> str:
        """Target pieces → the string the export gives (without eos, pad and unk; NLLB: and
        without the language codes)."""
        if self.kind == "nllb":
            text = "".join(t for t in tokens if t in self.pieces).replace(_SPACE, " ")
            return text[1:] if text.startswith(" ") else text
        if not self.marian:
            return self.target_spm.decode([self.target_spm.piece_to_id(t) for t in tokens])
        text = "".join(t for t in tokens if t not in self.dropped)
        return text.replace(_SPACE, " ").strip(" \t\n\r\f\v")


class Ct2Translator:
    """A CTranslate2 translator with the decoding settings of its export.

    Args:
        path: the directory `nlp.export.ctranslate2.write` wrote.
        threads: CPU threads of one translation (0: CTranslate2's default).
        patience: CTranslate2's beam patience: it stops a sentence once ``beam_size *
            patience`` hypotheses have finished (None: the directory's ``settings.json``).
    """

    def __init__(self, path: str | os.PathLike, threads: int = 0,
                 patience: float | None = None):
        import ctranslate2

        path = os.fspath(path)
        self.settings = read_settings(path)
        self.patience = float(self.settings["patience"] if patience is None else patience)
        self.translator = ctranslate2.Translator(path, device="cpu", inter_threads=1,
                                                 intra_threads=threads)
        self.text = TextCodec(path, self.settings)
        special = self.settings["special_tokens"]
        self.eos, self.source_eos = special["eos"], special["source_eos"]
        self.banned = [[token] for token in special["banned"]]
        target = self.settings.get("target_lang")
        self.target_prefix = [target] if self.settings["tokenizer"] == "nllb" else []

    @property
    def beam_size(self) -> int:
        return int(self.settings["beam_size"])

    def translate(self, texts: list[str], beam_size: int | None = None,
                  batch_size: int = 32) -> list[str]:
        """Translations of ``texts`` (beam search of the export's width, or ``beam_size``)."""
        sources = [self.text.tokenize(text) for text in texts]
        return [self.text.detokenize(nbest[0][1])
                for nbest in self.translate_tokens(sources, beam_size, batch_size=batch_size)]

    def translate_nbest(self, texts: list[str], k: int, beam_size: int | None = None,
                        batch_size: int = 32) -> list[list[tuple[float, str]]]:
        """The ``k`` best ``(score, translation)`` of each text, best first; the score is the
        length-penalized log-probability."""
        sources = [self.text.tokenize(text) for text in texts]
        return [[(score, self.text.detokenize(tokens)) for score, tokens in nbest[:k]]
                for nbest in self.translate_tokens(sources, beam_size, batch_size=batch_size)]

    def _score(self, log_p: float, length: int) -> float:
        alpha = float(self.settings["length_penalty"])
        if self.settings["convention"] == "gnmt":
            return log_p / ((5.0 + length) / 6.0) ** alpha
        return log_p / length ** alpha

    def translate_tokens(self, sources: list[list[str]], beam_size: int | None = None,
                         batch_size: int = 32) -> list[list[tuple[float, list[str]]]]:
        """Every source's hypotheses ``(score, target pieces without eos)``, best first.

        Args:
            sources: source pieces without eos (longer ones are cut as the export cuts them).
            beam_size: the export's (None) or another width; 1 is greedy search.
            batch_size: most sentences CTranslate2 decodes at once.
        """
        beam = self.beam_size if beam_size is None else int(beam_size)
        keep = int(self.settings["max_source_length"]) - 1
        sources = [list(s[:keep]) + [self.source_eos] for s in sources]
        extra = int(self.settings["extra_length"])
        groups: dict[int, list[int]] = {}
        for index, source in enumerate(sources):
            groups.setdefault(len(source) + extra, []).append(index)
        candidates = max(1, round(beam * self.patience)) if beam > 1 else 1
        lp_ct2 = float(self.settings["length_penalty"])
        results: list = [None] * len(sources)
        for limit, indices in groups.items():
            batch = [sources[i] for i in indices]
            if limit <= 1:  # only eos may come
                for i in indices:
                    results[i] = [(0.0, [])]
                continue
            outputs = self.translator.translate_batch(
                batch, max_batch_size=batch_size, beam_size=beam, patience=self.patience,
                num_hypotheses=candidates, length_penalty=lp_ct2,
                suppress_sequences=self.banned or None,
                target_prefix=[self.target_prefix] * len(batch) if self.target_prefix else None,
                return_end_token=True, return_scores=True, max_input_length=0,
                max_decoding_length=limit - 1, min_decoding_length=0)
            for i, output in zip(indices, outputs):
                results[i] = self._rescore(output.hypotheses, output.scores, lp_ct2)
        return results

    def _rescore(self, hypotheses, scores, lp_ct2: float) -> list[tuple[float, list[str]]]:
        ranked = []
        for tokens, score in zip(hypotheses, scores):
            log_p = score * len(tokens) ** lp_ct2 if tokens else score
            ended = bool(tokens) and tokens[-1] == self.eos
            length = len(tokens) + (0 if ended else 1)  # a cut beam: ours ends it with eos
            ranked.append((self._score(log_p, length), tokens[:-1] if ended else tokens))
        ranked.sort(key=lambda pair: -pair[0])
        return ranked

    def score_tokens(self, sources: list[list[str]], targets: list[list[str]]) -> list:
        """CTranslate2's log-probability of each target piece and of the eos after it."""
        sources = [list(s) + [self.source_eos] for s in sources]
        return [result.log_probs for result in self.translator.score_batch(sources, targets)]
