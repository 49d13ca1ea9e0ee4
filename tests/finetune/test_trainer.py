"""The fine-tuning loop, the saved model, `run_seeds` and the electra-finetune binary.

Tiny model over the fixture vocabulary; Rotten Tomatoes subsets (the packaged data) and a SQuAD
2.0 file derived from Rotten Tomatoes sentences (see test_heads: the longest word answers
"which is the longest word ?", sentences without digits make "which word is a number ?"
unanswerable).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ConfigError
from electra_tf.convert.pretrained import save_electra_checkpoint
from electra_tf.finetune import features as F
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.heads import SentenceClassifier, SpanQuestionAnswerer
from electra_tf.finetune.task_data import rotten_tomatoes_examples
from electra_tf.finetune.examples import TaskDataError
from electra_tf.finetune.saving import load_finetuned
from electra_tf.finetune.encoder_weights import load_encoder_weights
from electra_tf.finetune.seeds import finetune, summarize, task_from_options
from electra_tf.models import Discriminator

REPO = Path(__file__).resolve().parents[2]
FC = FinetuningConfig(num_train_epochs=2, train_batch_size=16, eval_batch_size=16, max_seq_length=32,
                      learning_rate=1e-3, log_every_steps=2)


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory, tiny_config, vocab_file):
    """A 'pretrained' discriminator (random weights) in our checkpoint format, with its RTD head,
    as the pretraining binary writes `model_dir/discriminator`."""
    tf.keras.utils.set_random_seed(123)
    disc = Discriminator(tiny_config)
    folder = tmp_path_factory.mktemp("pretrain") / "discriminator"
    save_electra_checkpoint(disc, tiny_config, folder, vocab_file=vocab_file)
    return folder, disc


def test_init_checkpoint_restores_encoder_exactly(pretrained_dir, tokenizer, rt_balanced, tiny_config):
    folder, disc = pretrained_dir
    features = F.featurize_sentences(rt_balanced[:8], tokenizer, 32)
    inputs = {k: features[k] for k in ("input_ids", "input_mask", "segment_ids")}
    head = SentenceClassifier(tiny_config, num_labels=2)
    saved = disc(inputs, training=False)["sequence_output"].numpy()
    assert not np.allclose(head.encode(inputs, False)["sequence_output"], saved)
    config = load_encoder_weights(head, folder)
    assert config == tiny_config
    np.testing.assert_array_equal(head.encode(inputs, False)["sequence_output"].numpy(), saved)
    np.testing.assert_array_equal(head.encode(inputs, False)["cls_output"].numpy(), saved[:, 0])
    assert {v.path: v.numpy().tobytes() for v in head.encoder.weights} == {
        v.path: v.numpy().tobytes() for v in disc.weights if "discriminator_predictions" not in v.path}


def test_pretraining_export_restores_encoder_exactly(tmp_path, tiny_config, vocab_file):
    """`<pretrain model_dir>/discriminator` as the pretraining loop exports it (embeddings
    shared with the generator) restores into the head's encoder unchanged."""
    from electra_tf.models import ElectraPretrainer
    from electra_tf.models.encoder import dummy_inputs
    from electra_tf.training.loop import export_discriminator

    tf.keras.utils.set_random_seed(7)
    pretrainer = ElectraPretrainer(tiny_config)
    export_discriminator(pretrainer, tmp_path / "discriminator", vocab_file=vocab_file)
    head = SpanQuestionAnswerer(tiny_config)
    load_encoder_weights(head, tmp_path / "discriminator")
    inputs = dummy_inputs(2, 16)
    np.testing.assert_array_equal(head.encode(inputs, False)["sequence_output"].numpy(),
                                  pretrainer.discriminator(inputs, training=False)["sequence_output"].numpy())


def _events(folder):
    tags = {}
    for path in Path(folder).glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    return tags


def test_finetune_rotten_tomatoes_from_checkpoint(pretrained_dir, tmp_path, iterated_datasets):
    folder, _ = pretrained_dir
    lines = []
    result = finetune("rotten_tomatoes", finetuning_config=FC, init_checkpoint=folder,
                      model_dir=tmp_path, seed=3, max_train_examples=64, max_eval_examples=40,
                      log=lines.append)
    # The training and evaluation inputs run without tf.data's autotuner, whose wake-up an
    # iterator's end waits for (`data.pipeline.untuned`).
    assert len(iterated_datasets) >= 2
    assert all(d.options().autotune.enabled is False for d in iterated_datasets)
    # 64 examples / 16 = 4 steps per epoch, 8 in all; an evaluation after each epoch.
    assert result["train_steps"] == 8 and [h["epoch"] for h in result["history"]] == [1, 2]
    assert any("ETA" in line and "steps/s" in line and "loss" in line for line in lines)
    best = max(result["history"], key=lambda h: h["accuracy"])
    assert result["best"]["accuracy"] == best["accuracy"] and result["best_epoch"] == best["epoch"]
    assert json.loads((tmp_path / "results.json").read_text())["best"] == result["best"]
    # Predictions of every epoch, JSONL, one per eval example.
    records = [json.loads(l) for l in (tmp_path / "predictions" / "epoch_1.jsonl").read_text().splitlines()]
    assert len(records) == 40 and {r["label"] for r in records} <= {"negative", "positive"}
    # TensorBoard: training loss and lr each logging step, eval metrics each epoch.
    train = _events(tmp_path / "logs" / "train")
    assert [s for s, _ in train["loss"]] == [2, 4, 6, 8]
    lrs = [v for _, v in train["learning_rate"]]
    # 8 steps: a 10% warmup would be under one step, so none (`warmup_steps`); linear decay.
    assert lrs == sorted(lrs, reverse=True) and lrs[0] < 1e-3
    assert [s for s, _ in _events(tmp_path / "logs" / "eval")["accuracy"]] == [4, 8]
    # The saved best model: layout, and the same predictions after loading.
    best_dir = tmp_path / "best"
    assert {p.name for p in best_dir.iterdir()} >= {
        "head_config.json", "config.json", "model.index", "vocab.txt", "predictions.jsonl"}
    head, model, vocab = load_finetuned(tmp_path)
    assert isinstance(head, SentenceClassifier) and Path(vocab) == best_dir / "vocab.txt"
    assert (model.head, model.family, model.task, model.num_labels, model.label_names,
            model.max_seq_length, model.text_pair) == ("SentenceClassifier", "classification",
                                                       "rotten_tomatoes", 2, ("negative", "positive"), 32, False)
    saved = json.loads((best_dir / "head_config.json").read_text())
    assert saved["family"] == "classification" and saved["version"] == 2 and "kind" not in saved
    from electra_tf.data.tokenizer import WordpieceTokenizer
    from electra_tf.finetune.trainer import _subsample

    dev = _subsample(rotten_tomatoes_examples("dev"), 40)
    features = F.featurize_sentences(dev, WordpieceTokenizer(vocab), 32)
    probs = tf.nn.softmax(head(features)["logits"]).numpy()
    saved = [json.loads(l) for l in (best_dir / "predictions.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(probs, [r["probabilities"] for r in saved], atol=2e-6)


def test_fewer_examples_than_a_batch_take_a_real_step(tmp_path, tiny_config, vocab_file, rt_balanced):
    """5 examples, batches of 16: one step, at the peak learning rate (a warmup under one step
    would leave it at 0), and a warning that says why the batch repeats examples."""
    from electra_tf.finetune.train_step import warmup_steps

    assert warmup_steps(FC, 8) == 0.0 and warmup_steps(FC, 100) == pytest.approx(10.0)
    lines = []
    result = finetune("rotten_tomatoes", tiny_config, FC.replace(num_train_epochs=1, log_every_steps=1),
                      train_examples=rt_balanced[:5], eval_examples=rt_balanced[:4],
                      vocab_file=vocab_file, model_dir=tmp_path, log=lines.append)
    assert result["train_steps"] == 1
    assert any(line.startswith("WARNING: rotten_tomatoes: the training set (5 inputs) is smaller "
                               "than one batch of 16") for line in lines)
    assert _events(tmp_path / "logs" / "train")["learning_rate"] == [(1, pytest.approx(1e-3))]


def _squad_json(path, rt_sentences):
    import re

    paragraphs = []
    for i, sentence in enumerate([s for s in rt_sentences[500:600] if len(s.split()) <= 14][:10]):
        starts = [m.start() for m in re.finditer(r"\S+", sentence)]
        _, _, word, start = max((len(w), -s, w, s) for w, s in zip(sentence.split(), starts) if w.isalpha())
        qas = [{"id": f"long{i}", "question": "which is the longest word ?", "is_impossible": False,
                "answers": [{"text": word, "answer_start": start}]}]
        if not re.search(r"\d", sentence):
            qas.append({"id": f"num{i}", "question": "which word is a number ?", "is_impossible": True,
                        "answers": []})
        paragraphs.append({"context": sentence, "qas": qas})
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "rt", "paragraphs": paragraphs}]}, indent=1))
    return path


def test_finetune_squad2_file_random_init(tmp_path, tiny_config, vocab_file, rt_sentences):
    data = _squad_json(tmp_path / "rt_squad.json", rt_sentences)
    fc = FC.replace(max_seq_length=48, max_query_length=8, doc_stride=16, num_train_epochs=1,
                    train_batch_size=8, n_best_size=5)
    task = task_from_options("squad2.0")
    result = finetune(task, tiny_config, fc, train_path=data, eval_path=data, vocab_file=vocab_file,
                      model_dir=tmp_path / "run")
    assert {"exact", "f1", "HasAns_exact", "NoAns_exact", "best_exact", "main"} <= set(result["best"])
    qids = {q["id"] for p in json.loads(data.read_text())["data"][0]["paragraphs"] for q in p["qas"]}
    predictions = json.loads((tmp_path / "run" / "best" / "predictions.json").read_text())
    null_odds = json.loads((tmp_path / "run" / "best" / "predictions_null_odds.json").read_text())
    assert set(predictions) == set(null_odds) == qids
    contexts = {q["id"]: p["context"] for p in json.loads(data.read_text())["data"][0]["paragraphs"] for q in p["qas"]}
    assert all(text in contexts[qid] for qid, text in predictions.items())  # "" or a context span
    head, model, _ = load_finetuned(tmp_path / "run" / "best")
    assert isinstance(head, SpanQuestionAnswerer) and head.beam_size == 5
    assert model.qa.version_2 is True and model.qa.null_score_diff_threshold == -2.75


def test_find_finetuned_in_every_layout(tmp_path, monkeypatch):
    from electra_tf.finetune.saving import find_finetuned

    def model(folder):
        folder.mkdir(parents=True)
        (folder / "head_config.json").write_text("{}")
        return folder

    one_seed = model(tmp_path / "one" / "best")  # one seed: model_dir/best
    assert find_finetuned(tmp_path / "one") == one_seed and find_finetuned(one_seed) == one_seed
    # Written before model_dir/best held the best seed: results.json names the seed's folder.
    old = model(tmp_path / "old" / "seed_3" / "best")
    (tmp_path / "old" / "results.json").write_text(json.dumps({"best_model": "seed_3/best"}))
    assert find_finetuned(tmp_path / "old") == old
    monkeypatch.setenv("HOME", str(tmp_path))
    assert find_finetuned("~/one") == one_seed


def test_summarize_median_and_spread():
    s = summarize([70.0, 90.0, 80.0, 60.0])
    assert (s["median"], s["min"], s["max"]) == (75.0, 60.0, 90.0)
    assert s["std"] == pytest.approx(np.std([70, 90, 80, 60], ddof=1))
    assert summarize([5.0])["std"] == 0.0


# ---------------------------------------------------------------------------------------
# Bad inputs: errors name the file, the line and the field.
# ---------------------------------------------------------------------------------------


def _finetune_file(tmp_path, task, train, tiny_config, vocab_file):
    return finetune(task, tiny_config, FC, train_path=train, eval_path=train, vocab_file=vocab_file,
                    model_dir=tmp_path / "out")


def test_bad_inputs_name_file_line_and_field(tmp_path, tiny_config, vocab_file):
    bad_json = tmp_path / "train.jsonl"
    bad_json.write_text('{"text": "a fine film", "label": "pos"}\n{"text": "dull", "label": \n')
    with pytest.raises(TaskDataError, match=rf"{bad_json}:2: malformed JSON"):
        _finetune_file(tmp_path, task_from_options("classification"), bad_json, tiny_config, vocab_file)

    missing = tmp_path / "train.csv"
    missing.write_text("sentence,label\na fine film,pos\n")
    with pytest.raises(TaskDataError, match=rf"{missing}:1: field 'review': missing column"):
        _finetune_file(tmp_path, task_from_options("classification", text_column="review"), missing,
                       tiny_config, vocab_file)

    unknown = tmp_path / "labels.csv"
    unknown.write_text("text,label\na fine film,pos\na dull film,meh\n")
    with pytest.raises(TaskDataError, match=rf"{unknown}:3: field 'label': label 'meh' is not in"):
        _finetune_file(tmp_path, task_from_options("classification", labels=["neg", "pos"]), unknown,
                       tiny_config, vocab_file)

    empty = tmp_path / "empty.tsv"
    empty.write_text("text\tlabel\na fine film\t1.5\n \t2.0\n")
    with pytest.raises(TaskDataError, match=rf"{empty}:3: field 'text': empty text"):
        _finetune_file(tmp_path, task_from_options("regression"), empty, tiny_config, vocab_file)

    hparams = tmp_path / "finetuning.json"
    hparams.write_text('{"learning_rate": -1}')
    with pytest.raises(ConfigError, match=rf"{hparams}: FinetuningConfig.learning_rate: must be > 0"):
        FinetuningConfig.from_json(hparams)
    with pytest.raises(ConfigError, match="FinetuningConfig.train_batch_size: must be an integer"):
        FinetuningConfig(train_batch_size=1.5)

    head_config = tmp_path / "best" / "head_config.json"
    head_config.parent.mkdir()
    head_config.write_text('{"format": "electra_tf_finetuned",\n "kind": }')
    with pytest.raises(ValueError, match=rf"{head_config}:2: not valid JSON"):
        load_finetuned(tmp_path)


def test_truncated_finetuned_checkpoint_names_the_file(tmp_path, tiny_config, vocab_file):
    from electra_tf.finetune.tasks import Task
    from electra_tf.finetune.saving import describe_finetuned, save_finetuned

    head = SentenceClassifier(tiny_config, num_labels=2)
    task = Task("sentiment", "classification", ("neg", "pos"))
    best = save_finetuned(head, tmp_path / "best", describe_finetuned(head, task, FC), vocab_file)
    data = best / "model.data-00000-of-00001"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    with pytest.raises(ValueError) as info:  # electra-export reports a ValueError in one line
        load_finetuned(tmp_path)
    assert str(info.value) == (f"{data} is truncated or corrupt (shorter than its .index says); "
                               "re-download or re-write it")


def test_for_model_size_defaults():
    """The authors' per-task defaults, from the task's row (RTE, STS-B: 10 epochs) and family
    (QA: length 512, 2 epochs; tagging: length 256)."""
    from electra_tf.finetune.tasks import generic_task, get_task

    assert FinetuningConfig.for_model_size("small", get_task("sst-2")).learning_rate == 1e-4
    large = FinetuningConfig.for_model_size("large", get_task("rte"))
    assert (large.learning_rate, large.layerwise_lr_decay, large.num_train_epochs) == (5e-5, 0.9, 10.0)
    assert FinetuningConfig.for_model_size("base", get_task("stsb")).num_train_epochs == 10.0
    squad = FinetuningConfig.for_model_size("base", get_task("squad2.0"))
    assert (squad.max_seq_length, squad.num_train_epochs, squad.layerwise_lr_decay) == (512, 2.0, 0.8)
    assert FinetuningConfig.for_model_size("base", generic_task("qa")).max_seq_length == 512
    assert FinetuningConfig.for_model_size("base", generic_task("tagging")).max_seq_length == 256
    base = FinetuningConfig.for_model_size("base", get_task("mnli"))
    assert (base.train_batch_size, base.warmup_proportion, base.weight_decay, base.max_seq_length,
            base.num_train_epochs) == (32, 0.1, 0.01, 128, 3.0)
    assert FinetuningConfig.for_model_size("base", get_task("mnli"), max_seq_length=64).max_seq_length == 64
    with pytest.raises(ConfigError, match="model_size"):
        FinetuningConfig.for_model_size("huge")


# ---------------------------------------------------------------------------------------
# The binary.
# ---------------------------------------------------------------------------------------


def _run_binary(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "electra_tf.tools.finetune", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


SMALL_RUN = ["--max_train_examples=48", "--max_eval_examples=32", "--num_train_epochs=1",
             "--train_batch_size=16", "--max_seq_length=32", "--log_every_steps=1"]


@pytest.mark.slow  # one subprocess run (TensorFlow start-up, 2 fine-tuning runs; ~15 CPU-s)
def test_binary_seeds_median_checkpoint(pretrained_dir, tmp_path):
    """Two seeds from a checkpoint: each seed's run in seed_<s>/, the median and spread, the best
    seed's model at the top. The binary's one-seed run from random initialization, given
    --config as a JSON file (the run is model_dir itself, no seed_0/, init_checkpoint None), is
    checked on the finished run test_rerun_safety.py builds for all its tests (`finished`)."""
    folder, _ = pretrained_dir
    out = tmp_path / "ft"
    proc = _run_binary("--task=rotten_tomatoes", f"--init_checkpoint={folder}", f"--model_dir={out}",
                       "--num_seeds=2", "--seed=5", *SMALL_RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["num_seeds"] == 2 and results["seeds"] == [5, 6]
    accuracies = [r["best"]["accuracy"] for r in results["runs"]]
    assert results["summary"]["accuracy"]["median"] == pytest.approx(np.median(accuracies))
    assert results["median"]["accuracy"] == results["summary"]["accuracy"]["median"]
    assert {"min", "max", "std"} <= set(results["summary"]["accuracy"])
    assert all((out / f"seed_{s}" / "best" / "head_config.json").exists() for s in (5, 6))
    assert results["best_model_dir"] == str(out / "best") and (out / "best" / "head_config.json").exists()
    assert "median" in proc.stdout and "over 2 seed(s)" in proc.stdout
    assert all(r["init_checkpoint"] == str(folder) for r in results["runs"])
    head, model, _ = load_finetuned(out)  # the best seed
    assert model.seed == max(results["runs"], key=lambda r: r["best"]["main"])["seed"]


def test_binary_reports_bad_input(tmp_path, vocab_file):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\na fine film,pos\n")
    proc = _run_binary("--task=classification", f"--train_file={train}", f"--eval_file={train}",
                       "--text_column=review", "--config=electra_tiny", f"--vocab_file={vocab_file}",
                       f"--model_dir={tmp_path / 'out'}")
    assert proc.returncode != 0
    assert f"{train}:1: field 'review': missing column" in proc.stderr


def test_binary_names_a_header_only_eval_file_and_its_split(tmp_path, vocab_file):
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text("sentence\tlabel\na fine film\tpos\na dull film\tneg\n")
    dev.write_text("sentence\tlabel\n")
    proc = _run_binary("--task=classification", f"--train_file={train}", f"--eval_file={dev}",
                       "--text_column=sentence", "--config=electra_tiny",
                       f"--vocab_file={vocab_file}", f"--model_dir={tmp_path / 'out'}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"electra-finetune: error: {dev}: no dev examples in the file (task 'classification'): "
        "it has no data rows, only a header or blank lines")


@pytest.mark.slow  # two runs, one mirrored over the two logical CPUs of tests/conftest.py (~20 s)
def test_mirrored_matches_one_device(tmp_path, tiny_config, vocab_file):
    from electra_tf.training.strategy import create_strategy

    config = tiny_config.replace(hidden_dropout=0.0, attention_dropout=0.0)  # no randomness
    folder = tmp_path / "discriminator"
    save_electra_checkpoint(Discriminator(config), config, folder, vocab_file=vocab_file)
    fc = FC.replace(num_train_epochs=1, dropout=0.0)
    runs = {}
    for name in ("one_device", "mirrored"):
        strategy = create_strategy(name)
        if name == "mirrored" and strategy.num_replicas_in_sync < 2:
            pytest.skip("needs two logical devices")
        finetune("rotten_tomatoes", finetuning_config=fc, init_checkpoint=folder, strategy=strategy,
                 model_dir=tmp_path / name, seed=1, max_train_examples=48, max_eval_examples=16)
        head, _, _ = load_finetuned(tmp_path / name)
        runs[name] = {v.path: v.numpy() for v in head.weights}
    # Same global batches, per-replica losses scaled by the global batch: the same updates.
    for path, value in runs["one_device"].items():
        np.testing.assert_allclose(runs["mirrored"][path], value, atol=2e-5, err_msg=path)


@pytest.mark.slow  # four short fine-tuning runs of the tiny model (~30 s)
@pytest.mark.parametrize("margin, jit", [(-1.0, True), (1e9, False)])
def test_the_step_path_probe_is_undone(tmp_path, tiny_config, vocab_file, monkeypatch, margin,
                                       jit):
    """The probe (forced to run; `margin` decides its choice) trains the head for real on an
    input of its own; its steps are undone and the run's input is untouched, so the fine-tuned
    model equals that of a run given the chosen path (bit for bit), and results.json says which
    path ran and why."""
    from electra_tf.training import step_path

    monkeypatch.setattr(step_path, "PROBE_SHARE", 1e9)
    monkeypatch.setattr(step_path, "MARGIN", margin)
    monkeypatch.setattr(step_path, "SAMPLE_SECONDS", 0.0)
    monkeypatch.setattr(step_path, "_MEMO", {})
    folder = tmp_path / "discriminator"
    save_electra_checkpoint(Discriminator(tiny_config), tiny_config, folder, vocab_file=vocab_file)
    runs = {}
    for name, fc in (("probed", FC.replace(num_train_epochs=1)),
                     ("forced", FC.replace(num_train_epochs=1, jit_compile=jit))):
        result = finetune("rotten_tomatoes", finetuning_config=fc, init_checkpoint=folder,
                          model_dir=tmp_path / name, seed=2, max_train_examples=48,
                          max_eval_examples=16)
        head, _, _ = load_finetuned(tmp_path / name / "best")
        runs[name] = ({v.path: v.numpy() for v in head.weights}, result)
    record = json.loads((tmp_path / "probed" / "results.json").read_text())["step_path"]
    assert record["path"] == ("xla" if jit else "graph")
    assert set(record["seconds_per_step"]) == {"graph", "xla"}
    assert "given" in runs["forced"][1]["step_path"]["reason"]
    (probed, probed_result), (forced, forced_result) = runs["probed"], runs["forced"]
    assert probed_result["history"] == forced_result["history"]
    assert set(probed) == set(forced) and len(probed) > 10
    for path in probed:
        np.testing.assert_array_equal(probed[path], forced[path], err_msg=path)
