"""Task files as programs write them, and training files that cannot teach a classifier: a
byte-order mark before the header, a column named twice, a single label."""

import json
import logging

import pytest

from electra_tf.finetune import task_data as td

SENT = td.Task("sent", "classification", text_column="text", label_column="label")
TAG = td.Task("chunk", "tagging", text_column="tokens", label_column="labels")
BOM = "\ufeff"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def error(fn, *args, **kwargs) -> str:
    with pytest.raises(td.TaskDataError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_a_byte_order_mark_before_the_first_line_is_dropped(tmp_path):
    """Excel's "CSV UTF-8" starts with one: it read as column '\\ufefftext' ("missing column")."""
    task = SENT.with_label_names(["neg", "pos"])
    files = {"a.csv": "text,label\ngood,pos\nbad,neg\n", "a.tsv": "text\tlabel\ngood\tpos\nbad\tneg\n",
             "a.jsonl": '{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n'}
    for name, text in files.items():
        path = write(tmp_path, name, BOM + text)
        assert td.infer_label_names(SENT, path) == ("neg", "pos")
        assert [(e.text, e.label) for e in td.read_file(task, path)] == [("good", 1), ("bad", 0)]
    conll = write(tmp_path, "t.conll", BOM + "He B-NP\nran B-VP\n")
    assert td.infer_label_names(TAG, conll) == ("B-NP", "B-VP")  # not '\ufeffHe'
    squad = {"data": [{"paragraphs": [{"context": "The cat sat.", "qas": [
        {"id": "q", "question": "Who?", "answers": [{"text": "cat", "answer_start": 4}]}]}]}]}
    path = write(tmp_path, "s.json", BOM + json.dumps(squad))
    assert td.read_file(td.get_task("squad1.1"), path)[0].answers == (td.QAAnswer("cat", 4),)


def test_a_column_the_task_reads_may_not_be_named_twice(tmp_path):
    path = write(tmp_path, "d.csv", "text,text,label\nthe review,a note,pos\n")
    message = error(td.read_file, SENT.with_label_names(["pos"]), path)
    assert message.startswith(f"{path}:1: field 'text': the header has this column 2 times (at "
                              "0-based positions [0, 1])"), message
    assert error(td.infer_label_names, SENT, path) == message
    # A repeated name nothing is read from (trailing commas) is no harm.
    path = write(tmp_path, "e.csv", "text,label,,\ngood,pos,,\nbad,neg,,\n")
    assert [e.label for e in td.read_file(SENT.with_label_names(["neg", "pos"]), path)] == [1, 0]


def test_one_label_in_a_training_file_is_refused_or_warned_about(tmp_path, caplog):
    # Inferred, the label set would have one class: refused, naming the file, field and label.
    path = write(tmp_path, "train.csv", "text,label\ngood,pos\nfine,pos\ngreat,pos\n")
    assert error(td.infer_label_names, SENT, path).startswith(
        f"{path}: field 'label': every label in the file is 'pos'; a classifier needs two classes")
    tags = write(tmp_path, "train.jsonl", '{"tokens": ["a", "b"], "labels": ["O", "O"]}\n')
    assert error(td.infer_label_names, TAG, tags).startswith(f"{tags}: field 'labels': every label")
    # Declared (here as --labels would), the run goes on with a warning; dev sets may hold one class.
    with caplog.at_level(logging.WARNING):
        td.load_examples(SENT.with_label_names(["neg", "pos"]), "dev", path=path)
        assert not caplog.records
        td.load_examples(SENT.with_label_names(["neg", "pos"]), "train", path=path)
        td.load_examples(TAG.with_label_names(["B-NP", "O"]), "train", path=tags)
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: every training label is 'pos', one of the 2 labels of task 'sent' (neg, pos): the "
        "model never sees another and will predict 'pos' for everything; check the file and the "
        "label column",
        f"{tags}: every training label is 'O', one of the 2 labels of task 'chunk' (B-NP, O): the "
        "model never sees another and will predict 'O' for everything; check the file and the "
        "label column"]
    # A GLUE task declares its labels: its train file in the GLUE layout with one of them.
    caplog.clear()
    glue = write(tmp_path, "train.tsv", "sentence\tlabel\ngood film\t1\nnice\t1\n")
    with caplog.at_level(logging.WARNING):
        td.load_examples(td.get_task("sst-2"), "train", path=glue)
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"{glue}: every training label is 'positive', one of the 2 labels of "
                              "task 'sst-2' (negative, positive)"), message
