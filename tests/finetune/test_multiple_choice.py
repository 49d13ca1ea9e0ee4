"""The multiple-choice family (`families/multiple_choice.py`): its files, its inputs, a run.

Data: a COPA-like task on Rotten Tomatoes sentences: the context is a sentence's first half,
the choices its true second half and the second halves of other sentences.
"""

import json

import numpy as np
import pytest

from electra_tf.finetune import features as F
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.families import get_family
from electra_tf.finetune.examples import ChoiceExample
from electra_tf.finetune.heads import MultipleChoiceClassifier
from electra_tf.finetune.task_data import load_examples
from electra_tf.finetune.examples import SentenceExample, TaskDataError
from electra_tf.finetune.saving import load_finetuned
from electra_tf.finetune.seeds import finetune, task_from_options

TASK = task_from_options("multiple_choice")


def _rows(sentences, n, num_choices=3, seed=0):
    """JSONL rows: {"context": first half, "choices": [second halves], "label": the true one}."""
    rng = np.random.default_rng(seed)
    halves = [(" ".join(w[: len(w) // 2]), " ".join(w[len(w) // 2:]))
              for w in (s.split() for s in sentences) if len(w) >= 6][: n + num_choices]
    rows = []
    for i in range(n):
        others = [halves[(i + k) % len(halves)][1] for k in range(1, num_choices - (i % 2))]
        choices = [halves[i][1], *others]  # every second example has one choice fewer
        order = rng.permutation(len(choices))
        rows.append({"context": halves[i][0], "choices": [choices[j] for j in order],
                     "label": int(np.argsort(order)[0])})
    return rows


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_reads_jsonl_and_names_file_line_and_field(tmp_path, rt_sentences):
    rows = _rows(rt_sentences, 4)
    examples = load_examples(TASK, "train", path=_write(tmp_path / "train.jsonl", rows))
    assert examples[0] == ChoiceExample(0, rows[0]["context"], tuple(rows[0]["choices"]), rows[0]["label"])
    assert [len(e.choices) for e in examples] == [3, 2, 3, 2]
    for bad, field, what in [({"choices": ["only one"]}, "choices", "at least two non-empty strings"),
                             ({"choices": "a b"}, "choices", "at least two"),
                             ({"label": 5}, "label", "is not the index of one of the 3 choices"),
                             ({"context": ""}, "context", "empty text")]:
        path = _write(tmp_path / "bad.jsonl", [rows[0], {**rows[0], **bad}])
        with pytest.raises(TaskDataError, match=rf"{path}:2: field '{field}': .*{what}"):
            load_examples(TASK, "train", path=path)


def test_each_choice_is_a_sentence_pair_and_missing_choices_are_zeros(tokenizer, rt_sentences):
    examples = [ChoiceExample(i, r["context"], tuple(r["choices"]), r["label"])
                for i, r in enumerate(_rows(rt_sentences, 4))]
    data = get_family("multiple_choice").featurize(TASK, examples, tokenizer, FinetuningConfig(max_seq_length=20),
                                                   training=True)
    assert data.arrays["input_ids"].shape == (4, 3, 20) and data.arrays["label"].tolist() == [e.label for e in examples]
    for i, e in enumerate(examples):
        pairs = F.featurize_sentences([SentenceExample(0, e.context, c) for c in e.choices], tokenizer, 20)
        for key in F.INPUT_KEYS:
            np.testing.assert_array_equal(data.arrays[key][i, : len(e.choices)], pairs[key], err_msg=key)
            assert not data.arrays[key][i, len(e.choices):].any()
    assert data.arrays["segment_ids"][0, 0].max() == 1  # [CLS] context [SEP] choice [SEP]


def test_finetune_from_a_data_dir_saves_evaluates_and_reloads(tmp_path, tiny_config, vocab_file, rt_sentences):
    rows = _rows(rt_sentences, 40)
    (tmp_path / "data").mkdir()
    _write(tmp_path / "data" / "train.jsonl", rows[:32])
    _write(tmp_path / "data" / "dev.jsonl", rows[32:])
    fc = FinetuningConfig(num_train_epochs=1, train_batch_size=8, eval_batch_size=8, max_seq_length=24)
    result = finetune(TASK, tiny_config, fc, data_dir=tmp_path / "data", vocab_file=vocab_file,
                      model_dir=tmp_path / "run", seed=1)
    assert result["train_steps"] == 4 and set(result["best"]) == {"accuracy", "main"}
    records = [json.loads(line) for line in (tmp_path / "run" / "best" / "predictions.jsonl").read_text().splitlines()]
    assert [r["label"] for r in records] == [r["label"] for r in rows[32:]]
    assert [len(r["probabilities"]) for r in records] == [len(r["choices"]) for r in rows[32:]]
    assert result["best"]["accuracy"] == pytest.approx(100 * np.mean([r["prediction"] == r["label"] for r in records]))
    head, model, _ = load_finetuned(tmp_path / "run")
    assert isinstance(head, MultipleChoiceClassifier)
    assert (model.family, model.head, model.task, model.label_names) == (
        "multiple_choice", "MultipleChoiceClassifier", "multiple_choice", None)
