"""Fixtures for the pretraining tests: a small vocab and real shards built from IMDB text.

The vocab is made by hand (specials first, then every character, its ## form and the 400 most
frequent words of 200 reviews): fast, and enough for WordPiece to cover the text. The shards are
a real build by `build_pretraining_data` (4 shards, length 32), so the loop reads what users read.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import re
import socket
import subprocess
import sys

import pytest
from tfrecord_framing import record_offsets

from electra_tf.data import corpus

SEQ_LENGTH = 32
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def pretrain_vocab(tmp_path_factory) -> str:
    docs = list(itertools.islice(corpus.imdb_documents(), 200))
    words = collections.Counter(
        w for doc in docs for line in doc for w in re.findall(r"[a-z]+|[^a-z\s]", line.lower()))
    chars = sorted({c for w in words for c in w if c.isprintable() and not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    vocab += [w for w, _ in words.most_common(400) if len(w) > 1 and w not in vocab]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def pretrain_shards(tmp_path_factory, pretrain_vocab) -> str:
    """A glob of 4 real TFRecord shards at SEQ_LENGTH."""
    from electra_tf.data import shards

    docs = list(itertools.islice(corpus.imdb_documents(), 200))
    root = tmp_path_factory.mktemp("pretrain_data")
    text = root / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    out = root / "shards"
    shards.build_pretraining_data(shards.BuildConfig(
        inputs=[str(text)], vocab_file=pretrain_vocab, output_dir=str(out),
        max_seq_length=SEQ_LENGTH, num_shards=4, num_processes=1, seed=0))
    return str(out / "pretrain_data.tfrecord-*")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_flags(data, vocab, model_dir, **extra) -> list[str]:
    """Command-line flags of a tiny, fast run of electra_tf.tools.pretrain."""
    values = dict(config="electra_tiny", data=data, vocab_file=vocab, model_dir=model_dir,
                  max_seq_length=SEQ_LENGTH, train_batch_size=8, num_train_steps=6,
                  num_warmup_steps=2, learning_rate=1e-3, steps_per_loop=2,
                  save_checkpoints_steps=2, summary_steps=2, keep_checkpoint_max=10, seed=3)
    values.update(extra)
    out = []
    for k, v in values.items():
        if isinstance(v, bool):
            out.append(f"--{k}" if v else f"--no{k}")
        elif isinstance(v, (list, tuple)):
            out += [f"--{k}={x}" for x in v]
        else:
            out.append(f"--{k}={v}")
    return out


def pretrain_process(args, env=None, launcher=None, **kwargs) -> subprocess.Popen:
    """`python -m electra_tf.tools.pretrain ARGS` from the repo root, one CPU thread pool, output piped.
    `launcher`: Python source run with `-c` instead, which must run the binary itself."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                    CUDA_VISIBLE_DEVICES="", TF_NUM_INTRAOP_THREADS="1")
    full_env.pop("TF_CONFIG", None)
    full_env.update(env or {})
    start = ["-c", launcher] if launcher else ["-m", "electra_tf.tools.pretrain"]
    return subprocess.Popen([sys.executable, *start, *args], cwd=REPO,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kwargs)


def folder_hashes(folder) -> dict[str, str]:
    """relative path -> sha256 of every file under `folder`."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def checkpoint_weights(checkpoint) -> dict:
    """The model's variables in a checkpoint: weights and dropout seed-generator states."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(checkpoint)
            if name.startswith("variables/")}


def scalar_values(model_dir, tag) -> list[tuple[int, float]]:
    """(step, value) of a TensorBoard scalar over the event files of model_dir/train."""
    import glob

    import tensorflow as tf

    out = []
    for path in sorted(glob.glob(os.path.join(model_dir, "train", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            out += [(event.step, float(tf.make_ndarray(v.tensor)))
                    for v in event.summary.value if v.tag == tag]
    return out


class TrainingHelpers:
    tiny_flags = staticmethod(tiny_flags)
    pretrain_process = staticmethod(pretrain_process)
    free_port = staticmethod(free_port)
    record_offsets = staticmethod(record_offsets)
    folder_hashes = staticmethod(folder_hashes)
    checkpoint_weights = staticmethod(checkpoint_weights)
    scalar_values = staticmethod(scalar_values)
    seq_length = SEQ_LENGTH
    repo = REPO


@pytest.fixture(scope="session")
def th():
    return TrainingHelpers
