import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import fcntl  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# No automatic full (generation-2) collections in the test processes. A worker holds 1-3 M
# objects, most of them the traced graphs of earlier tests, and each full collection over them
# stopped the worker for 1-43 s (on two cores, 24-69 s a worker and run; experiments/README.md,
# "The test suite's time"). The young generations are still collected; what survives them
# stays until the worker ends (peak 6.8 GB a worker). Scripts the tests start are untouched.
gc.set_threshold(*gc.get_threshold()[:2], 1_000_000_000)

# What a user's shell has: TensorFlow's start-up logging not suppressed (the scripts' quiet
# start is under test), no testing hooks.
SCRIPT_ENV = {key: value for key, value in os.environ.items()
              if key not in ("TF_CPP_MIN_LOG_LEVEL", "TFX_TRANSFORMER_VERBOSE",
                             "TFX_TRANSFORMER_FAULT", "TFX_TRANSFORMER_DEBUG", "TF_CONFIG")}


def _run_script(script, *args, fault=None, stdin=None, cwd=None, timeout=600):
    """``python scripts/SCRIPT args`` as a user runs it; ``fault`` sets TFX_TRANSFORMER_FAULT."""
    env = {**SCRIPT_ENV, "TFX_TRANSFORMER_FAULT": fault} if fault else SCRIPT_ENV
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)],
                          capture_output=True, text=True, env=env, input=stdin, cwd=cwd,
                          timeout=timeout)


@pytest.fixture(scope="session")
def run_script():
    """`_run_script`: ``run_script("train_nmt.py", "--workdir", path, fault="export")``."""
    return _run_script


def _keep_tf_seed(set_seed):
    """``tf.random.set_seed`` that does nothing when TensorFlow's global seed is that seed.

    TensorFlow's own also clears every eager kernel cache, so each test re-instantiated the
    functions it shared with earlier ones (16 % of the time of the decoding, export, layer and
    detector model tests). The global seed is the same either way; Keras's random state (its
    seed generator, NumPy's, Python's) is reset by `keras.utils.set_random_seed` as before.
    """
    current = []

    def keep(seed):
        if current != [seed]:
            set_seed(seed)
            current[:] = [seed]

    return keep


tf.random.set_seed = _keep_tf_seed(tf.random.set_seed)


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with float32 and a fixed seed, whatever the previous test set."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


# The reference scripts that run transformers' modeling code (it crashes a process that has
# TensorFlow loaded): name -> (script, what its ``main(path, *args)`` writes: an .npz file, or
# a folder "", args). `torch_references` runs them all in one process, so torch and
# transformers are imported once; the tests that use it share the xdist group
# "torch_reference" (one worker makes them, once).
TORCH_REFERENCES = {
    **{f"marian_{config}": ("nlp/pretrained/reference_marian.py", "", (config,))
       for config in ("shared", "separate", "tcbig")},
    "m2m100": ("nlp/pretrained/reference_m2m100.py", "", ()),
    "deformable_attention": ("tfx_transformer/layers/reference_deformable_attention.py", ".npz",
                             ()),
    "rtdetr_decoder": ("vision/pretrained/reference_rtdetr_decoder.py", ".npz", ()),
    "rtdetr": ("vision/pretrained/reference_rtdetr.py", "", ()),
    "hgnetv2": ("vision/pretrained/reference_hgnetv2.py", ".npz", ()),
    "dfine": ("vision/pretrained/reference_dfine.py", "", ()),
}


@pytest.fixture(scope="session")
def torch_references(tmp_path_factory):
    """{name: the path (`pathlib.Path`) its script wrote} of `TORCH_REFERENCES`."""
    import importlib.util
    import json

    if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
        pytest.skip("torch and transformers are not installed (make test installs them)")
    tmp = tmp_path_factory.mktemp("torch_references")
    paths = {name: tmp / (name + suffix) for name, (_, suffix, _) in TORCH_REFERENCES.items()}
    jobs = [(str(ROOT / "tests" / script), str(paths[name]), args)
            for name, (script, _, args) in TORCH_REFERENCES.items()]
    code = ("import runpy, sys, json\n"
            "for script, out, args in json.loads(sys.argv[1]):\n"
            "    runpy.run_path(script)['main'](out, *args)\n")
    subprocess.run([sys.executable, "-c", code, json.dumps(jobs)], check=True,
                   env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"})
    return paths


# --- Shared exports, written once per test run. Read them; copy (shutil.copytree) to change. ---


def _made_once(tmp_path_factory, name, make):
    """``make(folder)``, once per test run; returns the folder.

    Under pytest-xdist the workers share one folder in the run's base temporary directory: the
    first worker to get here makes it, another waits for it (a lock) and reads what it wrote, so
    a session artefact costs one build per run, not one per worker. Without xdist: a new folder.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    run = tmp_path_factory.getbasetemp().parent  # this run's (xdist: BASETEMP/popen-gwN)
    folder = run / f"shared-{name}"
    with open(run / f"shared-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / ".complete").exists():  # nobody made it, or a worker failed to
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".complete").touch()
    return folder


WEIGHTS = "model.weights.h5"  # the shared model's weights, for the workers that did not make it

NMT_DECODING = dict(beam_size=3, length_penalty=0.6, extra_length=6)


def _nmt_model(tokenizer):
    from nlp.modeling.model import Seq2SeqTransformer

    keras.utils.set_random_seed(1)
    return Seq2SeqTransformer(vocab_size=tokenizer.vocab_size, num_encoder_layers=1,
                              num_decoder_layers=1, d_model=32, num_heads=4, ffn_dim=64,
                              dropout=0.0, max_positions=128)


@pytest.fixture(scope="session")
def nmt_export(tmp_path_factory):
    """(model, tokenizer, export path) of a tiny untrained translator (beam 3, extra 6); the
    export's folder also holds its tokenizer, ``tok.model``.

    The export directory held a stale file before: `export_translator` replaces it whole.
    Made once per run (`_made_once`); a worker that did not make it builds the same model and
    reads the maker's weights into it.
    """
    from nlp.data.embedded import generate_pairs
    from nlp.export.translator import export_translator
    from nlp.search.decoding import DecodingSettings
    from nlp.text.tokenizer import Tokenizer
    from nlp.text.vocabulary import train_tokenizer

    made = []

    def make(folder):
        pairs = generate_pairs(200)
        path = train_tokenizer([t for p in pairs for t in p], str(folder / "tok.model"),
                               vocab_size=200)
        tokenizer = Tokenizer.from_file(path)
        model = _nmt_model(tokenizer)
        (folder / "export").mkdir()
        (folder / "export" / "stale.txt").write_text("from an earlier run")
        export_translator(model, tokenizer, folder / "export", DecodingSettings(**NMT_DECODING))
        model.save_weights(str(folder / WEIGHTS))
        made.extend([model, tokenizer])

    folder = _made_once(tmp_path_factory, "nmt_export", make)
    if not made:
        tokenizer = Tokenizer.from_file(str(folder / "tok.model"))
        model = _nmt_model(tokenizer)
        model.load_weights(str(folder / WEIGHTS))
        made.extend([model, tokenizer])
    return made[0], made[1], folder / "export"


@pytest.fixture(scope="session")
def nmt_workdir(tmp_path_factory):
    """A finished ``scripts/train_nmt.py`` run on 60 pairs, 2 epochs: (workdir, tsv, process).

    Flags beyond the defaults: a vocabulary, batches and beam small enough for 60 pairs, the
    export averaged over both epochs, 3 sentences scored every epoch.
    """
    from nlp.data.embedded import generate_pairs

    tmp = tmp_path_factory.mktemp("nmt_workdir")
    tsv = tmp / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in generate_pairs(60)), encoding="utf-8")
    work = tmp / "work"
    done = _run_script("train_nmt.py", "--data", f"tsv:{tsv}", "--workdir", work,
                      "--epochs", 2, "--vocab-size", 100, "--beam", 2, "--batch-tokens", 400,
                      "--average-last", 2, "--valid-sentences", 3)
    assert done.returncode == 0, done.stderr[-3000:]
    return work, tsv, done


def _dots_coco(folder, objects_per_image) -> str:
    """A one-class ("dot") ``coco:`` source in ``folder``: a black 32x32 PNG per entry of
    ``objects_per_image``, holding that many 2x2 boxes; returns its spec."""
    import json

    from PIL import Image

    images, annotations = [], []
    for index, count in enumerate(objects_per_image):
        Image.new("RGB", (32, 32)).save(folder / f"{index}.png")
        images.append({"id": index + 1, "file_name": f"{index}.png", "width": 32, "height": 32})
        annotations += [{"id": len(annotations) + 1, "image_id": index + 1, "category_id": 1,
                         "bbox": [i, i, 2, 2]} for i in range(count)]
    (folder / "ann.json").write_text(json.dumps({
        "images": images, "categories": [{"id": 1, "name": "dot"}],
        "annotations": annotations}))
    return f"coco:{folder}:{folder / 'ann.json'}"


@pytest.fixture(scope="session")
def dots_coco():
    """`_dots_coco`: ``dots_coco(tmp_path, [3, 1])`` -> ``"coco:DIR:DIR/ann.json"``."""
    return _dots_coco


DETR_NAMES = ("circle", "square", "triangle")
DETR_SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6,
                  tiny_filters=(8, 16, 16, 32), num_encoder_layers=1, num_decoder_layers=2)
DETR_IMAGE_SIZE, DETR_MAX_SIZE = 48, 64


def _detr_model():
    from vision.config import preset
    from vision.modeling.detr import build_model

    config = preset("tiny", **DETR_SMALL)
    # Its own seed: whatever ran before on this worker, its weights are not those a run
    # seeded with the default seed (0) starts from.
    keras.utils.set_random_seed(1234)
    return build_model(config, len(DETR_NAMES)), config


@pytest.fixture(scope="session")
def detr_export(tmp_path_factory):
    """(model, export path, config) of a small untrained detector (circle, square, triangle;
    no category ids), images resized to 48 (longest side at most 64).

    Made once per run (`_made_once`); a worker that did not make it builds the same model and
    reads the maker's weights into it.
    """
    from vision.export.saved_model import export_detector

    made = []

    def make(folder):
        model, config = _detr_model()
        export_detector(model, folder / "export", DETR_NAMES, DETR_IMAGE_SIZE, DETR_MAX_SIZE)
        model.save_weights(str(folder / WEIGHTS))
        made.extend([model, config])

    folder = _made_once(tmp_path_factory, "detr_export", make)
    if not made:
        model, config = _detr_model()
        model.load_weights(str(folder / WEIGHTS))
        made.extend([model, config])
    return made[0], str(folder / "export"), made[1]  # as `export_detector` returns it


DETR_README = ("--data", "embedded", "--preset", "tiny")  # README: train_detr.py, --time-budget
DETR_MAX_STEPS = 2


@pytest.fixture(scope="session")
def detr_workdir(tmp_path_factory):
    """The README's ``train_detr.py`` command (``--max-steps 2`` for its time budget, 40 images
    evaluated), SIGKILLed
    when its export starts, then the same command again: (workdir, runs).

    ``runs["killed"]`` and ``runs["done"]``: (the process, its run.json, the bytes of every
    checkpoint file) after each.
    """
    import json

    work = tmp_path_factory.mktemp("detr_workdir") / "work"
    # --eval-limit: 40 of the 500 held-out images validated and scored, twice as fast a run.
    command = ("train_detr.py", *DETR_README, "--workdir", work, "--max-steps", DETR_MAX_STEPS,
               "--eval-limit", 40)
    runs = {}
    for name, fault in (("killed", "export"), ("done", None)):
        process = _run_script(*command, fault=fault)
        state = json.loads((work / "run.json").read_text()) if (work / "run.json").exists() \
            else None
        checkpoints = {p.name: p.read_bytes() for p in sorted((work / "checkpoints").glob("*"))}
        runs[name] = (process, state, checkpoints)
    return work, runs
