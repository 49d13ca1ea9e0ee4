"""Sentence scores from an Electric discriminator (electra_tf/scoring.py, tools/score.py).

A sentence's score is the sum over its WordPieces of -E(x)_t, the discriminator head's negated
output, from one forward pass over `[CLS] pieces [SEP]`. The model here is a random Electric
model: these tests pin the arithmetic and the plumbing, `test_ranking.py` what training gives.
"""

import functools
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.convert.pretrained import save_electra_checkpoint
from electra_tf.models import Discriminator, ElectraPretrainer
from electra_tf.electric_export import export_scorer
from electra_tf.scoring import Scorer, ScoringError, progress_logger, score_texts
from tests.server_process import serving

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = ("the film was great and i liked it a lot but plot acting is bad . , ! "
         "story of an actor who never found his way home").split()
SENTENCES = ["the film was great .", "i liked it a lot , but the plot is bad !",
             "an actor who never found his way home .", "bad acting",
             "the story of an actor who never found his way home , and the film was great ."]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    letters = sorted(set("".join(WORDS)))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *("##" + c for c in letters),
             *sorted(set(WORDS) - set(letters))]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def config(vocab_file):
    return ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file).replace(
        objective="electric", max_position_embeddings=64)


@pytest.fixture(scope="module")
def discriminator(config):
    tf.keras.utils.set_random_seed(1)
    return ElectraPretrainer(config).discriminator


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, discriminator, config, vocab_file):
    folder = tmp_path_factory.mktemp("electric") / "discriminator"
    save_electra_checkpoint(discriminator, config, folder, vocab_file=vocab_file)
    return str(folder)


def energies(discriminator, ids):
    """The head's raw output on one packed row: [seq]."""
    ids = tf.constant([ids], tf.int32)
    return discriminator({"input_ids": ids, "input_mask": tf.ones_like(ids),
                          "segment_ids": tf.zeros_like(ids)}, training=False)["rtd_logits"][0].numpy()


def test_one_pass_score_is_the_sum_of_separately_computed_token_terms(discriminator, vocab_file,
                                                                      config):
    scorer = Scorer(discriminator, vocab_file)
    results = scorer.score(SENTENCES, batch_size=2)
    for text, result in zip(SENTENCES, results):
        pieces = scorer.tokenizer.encode(text)
        ids = [config.cls_token_id, *pieces, config.sep_token_id]
        assert result.tokens == scorer.tokenizer.convert_ids_to_tokens(pieces)
        # Each term from its own pass, read at its own position only.
        terms = [-energies(discriminator, ids)[t] for t in range(1, len(ids) - 1)]
        np.testing.assert_allclose(result.token_scores, terms, atol=1e-5)
        assert result.score == pytest.approx(float(np.sum(terms, dtype=np.float64)), abs=1e-4)
        # [CLS] and [SEP] are not scored.
        everything = -energies(discriminator, ids).sum(dtype=np.float64)
        assert abs(everything - result.score) > 1e-3


def test_score_does_not_depend_on_batch_composition_or_padding(discriminator, vocab_file):
    scorer = Scorer(discriminator, vocab_file)
    alone = [scorer.score([s], batch_size=1)[0] for s in SENTENCES]
    longer = "the story of an actor who never found his way home , " * 3
    together = scorer.score([longer, *SENTENCES, longer + "!"], batch_size=7)[1:-1]
    reversed_batches = scorer.score(SENTENCES[::-1], batch_size=3)[::-1]
    for a, b, c in zip(alone, together, reversed_batches):
        assert abs(a.score - b.score) <= 1e-5 and abs(a.score - c.score) <= 1e-5
        np.testing.assert_allclose(a.token_scores, b.token_scores, atol=1e-5)


def test_checkpoint_folders_and_model_objects_give_the_same_scores(
        discriminator, checkpoint, vocab_file, tmp_path):
    direct = [r.score for r in score_texts(discriminator, SENTENCES, vocab_file=vocab_file)]
    from_folder = [r.score for r in score_texts(checkpoint, SENTENCES)]
    # A pretraining run's model_dir: its exported discriminator/ is used.
    run = tmp_path / "run"
    run.mkdir()
    (run / "pretraining_config.json").write_text("{}")
    os.symlink(checkpoint, run / "discriminator")
    from_run = [r.score for r in score_texts(str(run), SENTENCES)]
    np.testing.assert_allclose(from_folder, direct, atol=1e-5)
    np.testing.assert_allclose(from_run, direct, atol=1e-5)
    assert score_texts(checkpoint, [""])[0].score == 0.0  # an empty sentence sums nothing


def test_bad_input_is_one_clear_error(discriminator, config, vocab_file, tmp_path):
    scorer = Scorer(discriminator, vocab_file)
    with pytest.raises(ScoringError, match=r"text 2: \d+ WordPiece tokens, more than the model "
                                           r"takes \(62"):
        scorer.score(["the film", "the film was great " * 20])
    with pytest.raises(ScoringError, match="no discriminator head"):
        Scorer(Discriminator(config, rtd_head=False), vocab_file)
    with pytest.raises(ScoringError, match="vocab_size"):
        Scorer(Discriminator(config.replace(vocab_size=config.vocab_size + 1)), vocab_file)
    with pytest.raises(ScoringError, match="no such checkpoint"):
        Scorer.from_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ScoringError, match="needs its vocab_file"):
        score_texts(discriminator, SENTENCES)


def test_sentences_longer_than_the_pretraining_length_are_scored_with_a_warning(
        discriminator, vocab_file, caplog):
    scorer = Scorer(discriminator, vocab_file, trained_length=8)
    with caplog.at_level("WARNING"):
        results = scorer.score(SENTENCES)
    assert len(results) == 5
    assert "3 text(s) are longer than the pretraining length 8" in caplog.text


def test_progress_lines_give_rate_and_eta(discriminator, vocab_file):
    lines = []
    progress = progress_logger(every_seconds=1e-9, log_fn=lambda fmt, *a: lines.append(fmt % a))
    Scorer(discriminator, vocab_file).score(SENTENCES, batch_size=2, progress=progress)
    assert [line.split(" (")[0] for line in lines] == ["sentence 2/5", "sentence 4/5",
                                                        "sentence 5/5"]
    assert all("sentences/s" in line and "ETA" in line for line in lines)


def cli(module, *args, stdin=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          input=stdin, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_electra_score_command(checkpoint, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("\n".join([*SENTENCES, ""]) + "\n", encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    done = cli("electra_tf.tools.score", f"--checkpoint={checkpoint}", f"--input={text}", f"--output={out}",
                     "--format=jsonl", "--batch_size=2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sentence 6/6" in done.stderr  # the progress line
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    want = score_texts(checkpoint, [*SENTENCES, ""])
    assert [r["text"] for r in rows] == [*SENTENCES, ""]
    np.testing.assert_allclose([r["score"] for r in rows], [w.score for w in want], atol=1e-4)
    assert rows[0]["tokens"] == want[0].tokens and rows[-1]["score"] == 0.0

    tsv = cli("electra_tf.tools.score", f"--checkpoint={checkpoint}", "--input=-", stdin="the film was great .\n")
    assert tsv.returncode == 0, tsv.stderr[-2000:]
    score, sentence = tsv.stdout.rstrip("\n").split("\t")
    assert sentence == "the film was great ." and float(score) == pytest.approx(want[0].score, abs=1e-4)

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the film\nwas \xff great\n")
    for args, message in (([f"--input={bad}"], f"{bad}:2: not UTF-8 text"),
                          ([f"--input={tmp_path / 'missing.txt'}"], "cannot read"),
                          ([f"--input={text}", f"--checkpoint={tmp_path}"], "no checkpoint found")):
        failed = cli("electra_tf.tools.score", f"--checkpoint={checkpoint}", *args)
        assert failed.returncode == 1
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith("electra-score: error:") and message in last, failed.stderr[-1000:]

    # An --output that is an input (by another spelling too), or cannot be written: refused
    # before the model loads, the input untouched (it was replaced by its scores).
    before = text.read_bytes()
    for output, message in ((text.parent / "." / text.name, f"the same file as the input {text}"),
                            (next(p for p in sorted(Path(checkpoint).iterdir()) if p.is_file()), "the same file as the input"),
                            (tmp_path, "a folder"),
                            (tmp_path / "missing" / "scores.tsv", "does not exist")):
        failed = cli("electra_tf.tools.score", f"--checkpoint={checkpoint}", f"--input={text}",
                     f"--output={output}")
        last = failed.stderr.strip().splitlines()[-1]
        assert failed.returncode == 1 and last.startswith(f"electra-score: error: --output={output}: "), last
        assert message in last, last
    assert text.read_bytes() == before


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_electra_export_serves_electric_scores_from_another_process(checkpoint, tmp_path,
                                                                    monkeypatch):
    """electra-export writes the `score` signature of an Electric checkpoint; electra-serve, in
    its own process, answers REST :predict with the library's scores. The same export, loaded
    here, matches the library too (scores, token counts, truncation at --max_seq_length, the
    custom-op report), and `export_scorer` into the same base takes the next version and never
    overwrites one (one export checked for what two tests exported three times for)."""
    base = tmp_path / "export"
    done = cli("electra_tf.tools.export", f"--checkpoint={checkpoint}", f"--export_base={base}",
               "--model_name=electric", "--max_seq_length=32")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "score(text) -> " in done.stdout and (base / "electric/1/saved_model.pb").exists()
    rest = free_port()
    url = f"http://127.0.0.1:{rest}/v1/models/electric"
    command = [sys.executable, "-m", "electra_tf.tools.serve", f"--rest_api_port={rest}",
               f"--model_base_path={base / 'electric'}", "--port=0",
               "--file_system_poll_wait_seconds=0"]
    with serving(command, url, cwd=REPO,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")):
        body = json.dumps({"signature_name": "score", "instances": SENTENCES}).encode()
        answer = json.loads(urllib.request.urlopen(
            urllib.request.Request(url + ":predict", data=body), timeout=60).read())
    want = score_texts(checkpoint, SENTENCES)
    got = answer["predictions"]
    np.testing.assert_allclose([p["score"] for p in got], [w.score for w in want], atol=1e-4)
    assert [p["num_tokens"] for p in got] == [len(w.tokens) for w in want]
    for p, w in zip(got, want):  # each row's token scores, then zeros for [SEP] and padding
        np.testing.assert_allclose(p["token_scores"][1:len(w.tokens) + 1], w.token_scores,
                                   atol=1e-5)
        assert p["token_scores"][0] == 0.0 and not p["truncated"]

    # The export, loaded in this process, against the library.
    report = json.loads((base / "electric/1/assets.extra/electra_export.json").read_text())
    assert set(report["signatures"]) == {"score", "serving_default"}
    loaded = tf.saved_model.load(str(base / "electric" / "1"))
    texts = SENTENCES[:4] + ["the film was great " * 8]  # 32 pieces: over 32 with [CLS], [SEP]
    out = loaded.signatures["score"](text=tf.constant(texts))
    default = loaded.signatures["serving_default"](text=tf.constant(texts))
    assert set(default) == set(out)
    for key in out:  # the same function under both names
        np.testing.assert_array_equal(default[key].numpy(), out[key].numpy(), err_msg=key)
    np.testing.assert_allclose(out["score"].numpy()[:4], [w.score for w in want[:4]], atol=1e-4)
    assert out["num_tokens"].numpy().tolist()[:4] == [len(w.tokens) for w in want[:4]]
    assert out["truncated"].numpy().tolist() == [False] * 4 + [True]
    assert out["num_tokens"].numpy()[4] == 30
    # The next export takes the next version; an existing one is never overwritten. It traces
    # the scoring function once for both signatures.
    from electra_tf import electric_export

    traced, made = [], electric_export.score_endpoint

    def counted(*args):
        fn, spec = made(*args)

        @functools.wraps(fn)
        def body(*a, **k):
            traced.append(1)
            return fn(*a, **k)
        return body, spec

    monkeypatch.setattr(electric_export, "score_endpoint", counted)
    assert export_scorer(checkpoint, base, "electric", max_seq_length=24,
                         verbose=False) == str(base / "electric" / "2")
    assert len(traced) == 1
    with pytest.raises(FileExistsError, match="never overwritten"):
        export_scorer(checkpoint, base, "electric", version=1)


def test_electra_export_explains_what_it_cannot_export(tmp_path, checkpoint):
    empty = tmp_path / "empty"
    empty.mkdir()
    failed = cli("electra_tf.tools.export", f"--checkpoint={empty}", f"--export_base={tmp_path / 'out'}")
    assert failed.returncode == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("electra-export: ") and "no fine-tuned model" in last, failed.stderr
    assert "Electric" in last
    flag = cli("electra_tf.tools.export", f"--checkpoint={checkpoint}", f"--export_base={tmp_path / 'out'}",
               "--ids_only")
    assert flag.returncode == 1 and "--ids_only" in flag.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out" / "electra").exists()
