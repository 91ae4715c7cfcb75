"""A translation model by its Hugging Face Hub id (``Helsinki-NLP/opus-mt-en-de``,
``facebook/nllb-200-distilled-600M``): the folder `tfx-convert-nmt` reads, fetched into the
Hub's standard cache with ``huggingface_hub``.

Only the files a conversion reads are fetched (`PATTERNS`); ``pytorch_model.bin`` only where
the repository has no ``model.safetensors``. ``HF_HUB_OFFLINE=1`` reads the cache alone, and
``HF_HUB_CACHE`` / ``HF_HOME`` choose the cache, as for every Hub client. A revision (branch,
tag or commit) pins the files.
"""

from __future__ import annotations

import os
import re

__all__ = ["PATTERNS", "is_hub_id", "fetch_model"]

# What the converters read: Marian (OPUS-MT) and M2M100 / NLLB folders.
PATTERNS = ["config.json", "generation_config.json", "model.safetensors", "*.spm",
            "vocab.json", "target_vocab.json", "tokenizer_config.json",
            "special_tokens_map.json", "sentencepiece.bpe.model", "tokenizer.json"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` names a Hub repository (``owner/name``) rather than a local folder:
    it is of that form and no such path exists here."""
    return bool(_HUB_ID.match(text)) and not os.path.exists(text) and ".." not in text


def fetch_model(repo_id: str, revision: str | None = None, log=print) -> str:
    """The local folder of ``repo_id`` at ``revision`` (default: the main branch), fetched
    into the Hub cache where it is not there yet.

    Raises:
        ValueError: one line: no such repository or revision, no network and nothing cached,
            ``HF_HUB_OFFLINE=1`` and nothing cached, ``huggingface_hub`` not installed.
    """
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ImportError:
        raise ValueError(f"{repo_id}: fetching a Hub id needs huggingface_hub (pip install "
                         "huggingface_hub), or give a local folder") from None
    at = f"{repo_id}" + (f" at revision {revision}" if revision else "")
    offline = constants.HF_HUB_OFFLINE
    try:
        folder = huggingface_hub.snapshot_download(repo_id, revision=revision,
                                                   allow_patterns=PATTERNS)
        if not os.path.isfile(os.path.join(folder, "model.safetensors")):
            folder = huggingface_hub.snapshot_download(
                repo_id, revision=revision, allow_patterns=PATTERNS + ["pytorch_model.bin"])
    except errors.RevisionNotFoundError:
        raise ValueError(f"{at}: no such revision on the Hugging Face Hub") from None
    except errors.RepositoryNotFoundError:
        raise ValueError(f"{repo_id}: no such model on the Hugging Face Hub (or it is "
                         "private: log in with `hf auth login`)") from None
    except errors.LocalEntryNotFoundError:
        why = ("HF_HUB_OFFLINE=1 and the Hub cache "
               f"({constants.HF_HUB_CACHE}) does not hold it" if offline else
               "the Hub could not be reached and the cache "
               f"({constants.HF_HUB_CACHE}) does not hold it")
        raise ValueError(f"{at}: {why}") from None
    except errors.GatedRepoError:
        raise ValueError(f"{repo_id}: a gated model: accept its terms on the Hub and log in "
                         "with `hf auth login`") from None
    except (errors.HfHubHTTPError, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{at}: could not be fetched ({first})") from None
    log(f"fetched {at}: {folder}")
    return folder
