"""Cased vocabularies in fine-tuning: the casing is read from the checkpoint (`data/casing.py`),
overridable, recorded in head_config.json, and a vocabulary learned from cased text keeps
"Apple" and "apple" apart in the fine-tuning features; the uncased path is unchanged."""

import json

import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.convert.pretrained import save_electra_checkpoint
from electra_tf.data.casing import cased_tokens, checkpoint_lower_case, resolve_lower_case
from electra_tf.data.tokenizer import WordpieceTokenizer, learn_vocab, write_vocab
from electra_tf.finetune import features as F
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.tasks import Task
from electra_tf.finetune.examples import SentenceExample
from electra_tf.finetune.saving import load_finetuned
from electra_tf.finetune.seeds import finetune
from electra_tf.models import Discriminator

CASED_TEXT = ["Apple sells the apple pie .", "An apple a day , said Apple .",
              "The Apple store sold apple juice .", "apple trees grow near the Apple campus .",
              "I like apple and Apple likes me ."] * 20


@pytest.fixture(scope="module")
def cased_vocab(tmp_path_factory):
    """A vocabulary learned from cased text with lower_case=False (as electra-build-vocab
    --nolower_case does): "Apple" and "apple" are both whole tokens."""
    path = str(tmp_path_factory.mktemp("cased") / "vocab.txt")
    write_vocab(learn_vocab(CASED_TEXT, 200, lower_case=False), path)
    return path


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_checkpoint_lower_case_sources(tmp_path):
    hf = tmp_path / "bert-hf"
    _write(hf / "tokenizer_config.json", {"do_lower_case": False})
    assert checkpoint_lower_case(hf) == (False, f"{hf / 'tokenizer_config.json'} (do_lower_case)")
    pair = tmp_path / "hf-pair"
    _write(pair / "discriminator" / "tokenizer_config.json", {"do_lower_case": True})
    assert checkpoint_lower_case(pair)[0] is True
    preset = _write(tmp_path / "keras-hub" / "tokenizer.json", {"config": {"lowercase": False}}).parent
    assert checkpoint_lower_case(preset)[0] is False
    # electra_tf: the pretraining run's record beside model_dir/discriminator, or the marker.
    run = tmp_path / "run"
    # As electra-pretrain records it: the shards' casing at the top (None: no manifest) and in
    # the manifest's values.
    _write(run / "pretraining_config.json", {"lower_case": None, "manifest": {"lower_case": False},
                                             "pretraining_config": {"seed": 0}})
    (run / "discriminator").mkdir()
    assert checkpoint_lower_case(run / "discriminator") == (
        False, f"{run / 'pretraining_config.json'} (lower_case)")
    marker = _write(tmp_path / "export" / "electra_tf_checkpoint.json", {"format": "electra_tf", "lower_case": True})
    assert checkpoint_lower_case(marker.parent)[0] is True
    # TF1 releases: the folder name, like BERT's, for a folder or a checkpoint prefix in it.
    for name, expected in (("cased_L-12_H-768_A-12", False), ("uncased_L-12_H-768_A-12", True),
                           ("multi_cased_L-12", False), ("electra_small", None)):
        (tmp_path / name).mkdir()
        assert checkpoint_lower_case(tmp_path / name)[0] is expected, name
        assert checkpoint_lower_case(tmp_path / name / "model.ckpt-1000")[0] is expected, name


def test_resolve_explicit_beats_recorded_with_a_warning(tmp_path, cased_vocab):
    hf = _write(tmp_path / "hf" / "tokenizer_config.json", {"do_lower_case": False}).parent
    logs, warnings = [], []
    assert resolve_lower_case(None, hf, log=logs.append, warn=warnings.append) is False
    assert "lower_case=False from" in logs[-1] and not warnings
    assert resolve_lower_case(True, hf, log=logs.append, warn=warnings.append) is True
    assert "records lower_case=False" in warnings[-1]
    assert resolve_lower_case(False, hf, log=logs.append, warn=warnings.append) is False
    assert len(warnings) == 1
    # Nothing recorded: uncased, said in the log; a vocabulary with capitals draws a warning.
    plain = tmp_path / "plain"
    plain.mkdir()
    assert resolve_lower_case(None, plain, ["[CLS]", "the", "##s"], log=logs.append, warn=warnings.append) is True
    assert "nothing records the casing" in logs[-1] and len(warnings) == 1
    vocab = WordpieceTokenizer(cased_vocab).vocab
    assert {"Apple", "An"} <= set(cased_tokens(vocab)) and "[CLS]" not in cased_tokens(vocab)
    assert resolve_lower_case(None, plain, vocab, log=logs.append, warn=warnings.append) is True
    assert "--nolower_case" in warnings[-1] and "pieces with capitals" in warnings[-1]


def test_cased_vocabulary_keeps_apple_and_apple_apart(cased_vocab, vocab_file):
    examples = [SentenceExample(0, "Apple pie"), SentenceExample(1, "apple pie")]
    cased = F.featurize_sentences(examples, WordpieceTokenizer(cased_vocab, lower_case=False), 8)
    ids = WordpieceTokenizer(cased_vocab, lower_case=False)
    assert ids.encode("Apple") != ids.encode("apple") and len(ids.encode("Apple")) == 1
    assert cased["input_ids"][0].tolist() != cased["input_ids"][1].tolist()
    # Uncased (the default, and every vocabulary so far): the same ids for both, as before.
    uncased = F.featurize_sentences(examples, WordpieceTokenizer(vocab_file), 8)
    assert uncased["input_ids"][0].tolist() == uncased["input_ids"][1].tolist()
    assert WordpieceTokenizer(vocab_file).lower_case is True


def test_finetune_takes_the_checkpoints_casing(tmp_path, cased_vocab):
    """An electra_tf pretraining folder that records lower_case=false: fine-tuning keeps case,
    says where it read it, and writes it into head_config.json; --lower_case overrides it."""
    tf.keras.utils.set_random_seed(0)
    config = ElectraConfig.from_json("electra_tiny").with_vocab(cased_vocab)
    run = tmp_path / "pretrain"
    save_electra_checkpoint(Discriminator(config), config, run / "discriminator", vocab_file=cased_vocab)
    _write(run / "pretraining_config.json", {"pretraining_config": {"lower_case": False}})
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": str(int(t.startswith("A")))}) + "\n"
                            for t in CASED_TEXT[:5]))
    task = Task("company", "classification", ("0", "1"))
    fc = FinetuningConfig(num_train_epochs=1, train_batch_size=2, max_seq_length=16)
    lines = []
    result = finetune(task, finetuning_config=fc, init_checkpoint=run / "discriminator",
                      train_path=data, eval_path=data, model_dir=tmp_path / "ft", log=lines.append)
    assert result["lower_case"] is False
    assert any(f"lower_case=False from {run / 'pretraining_config.json'}" in line for line in lines)
    _, model, vocab = load_finetuned(tmp_path / "ft")
    assert model.lower_case is False
    tokenizer = WordpieceTokenizer(vocab, lower_case=model.lower_case)
    assert tokenizer.encode("Apple") != tokenizer.encode("apple")

    lines = []
    result = finetune(task, finetuning_config=fc, init_checkpoint=run / "discriminator", lower_case=True,
                      train_path=data, eval_path=data, model_dir=tmp_path / "ft_lower", log=lines.append)
    assert result["lower_case"] is True
    assert json.loads((tmp_path / "ft_lower" / "best" / "head_config.json").read_text())["lower_case"] is True
    assert any(line.startswith("WARNING: lower_case=True as given, but") for line in lines)
