"""The original GLUE files read by task name (`finetune/glue.py`), found in a task folder, and the
GLUE submission files; one tiny end-to-end run of `electra-finetune --data_dir` on MRPC.

The fake `glue_data/` below has each task's exact original header (none for CoLA's train/dev),
column count and known quirks: bare quotes in sentences, the byte-order mark before MRPC's
`Quality`, STS-B rows wider than the header (read from the end), QQP's line broken in two, an
MNLI label outside the label set, test files without labels and with an `index` / `id` column.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from electra_tf.finetune import glue
from electra_tf.finetune import examples as ex
from electra_tf.finetune import task_data as td
from electra_tf.finetune import tasks

REPO = Path(__file__).resolve().parents[2]
MNLI_PARSES = "( ( a ) b )\t( c )\t(ROOT (S a))\t(ROOT (S c))"

GLUE_DATA = {
    "CoLA": {
        "train.tsv": "gj04\t1\t\tOur friends won't buy this analysis.\n"
                     "gj04\t0\t*\tThey drank the pub.\n"
                     "gj04\t1\n"  # malformed: too short
                     "gj04\t1\t\tThe \"quoted\" word stays.\n",
        "dev.tsv": "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n"
                   "gj04\t0\t*\tThe more books I ask to whom he will give.\n",
        "test.tsv": "index\tsentence\n0\tBill whistled past the house.\n1\tThe car honked its way.\n",
    },
    "SST-2": {
        "train.tsv": "sentence\tlabel\nhide new secretions \t0\nthe greatest \"musicians\" \t1\n"
                     "no label here\t2\n",  # malformed: label outside the set
        "dev.tsv": "sentence\tlabel\nit 's a charming journey . \t1\nunflinchingly bleak \t0\n",
        "test.tsv": "index\tsentence\n0\tuneasy mishmash of styles\n1\tthis film 's relationship\n",
    },
    "MRPC": {
        "train.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                     "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , Amrozi accused .\n"
                     "0\t2108705\t2108831\tYucaipa owned \"Dominick 's\" .\tYucaipa bought Dominick 's .\n",
        "dev.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                   "1\t1355540\t1355592\tHe said the foods were good .\tThe foods were good , he said .\n",
        "test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                    "0\t1089874\t1089925\tPCCW 's chief will leave .\tThe chief will leave PCCW .\n"
                    "1\t3019446\t3019327\tThe world 's two largest makers .\tTwo makers merged .\n",
    },
    "STS-B": {
        "train.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
                     "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000\n"
                     # a wider row: the authors read STS-B from the end of the row
                     "1\tmain-forums\tdeft\t2014\t0002\tsrc\textra\tnone\tA man plays a flute.\tA man plays a bamboo flute.\t3.800\n"
                     "2\tmain-news\theadlines\t2015\t0003\tnone\tnone\tA cat.\tA dog.\tnot-a-number\n",
        "dev.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
                   "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat.\tA man wearing a hat.\t5.000\n",
        "test.tsv": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\n"
                    "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair.\tA girl brushes her hair.\n",
    },
    "QQP": {
        "train.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                     "133273\t213221\t213222\tHow is the life of a math student?\tWhich is the best math book?\t0\n"
                     # the original's line broken in two: both halves are too short, both skipped
                     "97931\t16\t17\tWas Muhammad a real historical figure?\n"
                     "\tWhat is the evidence for his existence?\t0\n"
                     "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control your horniness?\t1\n",
        "dev.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                   "201359\t303345\t303346\tWhy are African-Americans so beautiful?\tWhy are hispanics so beautiful?\t0\n",
        "test.tsv": "id\tquestion1\tquestion2\n0\tWould the idea work?\tWould it work?\n"
                    "1\tWhat is the right way?\n",  # too short: kept, predicted with an empty pair
    },
    "MNLI": {
        "train.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                     "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
                     f"0\t31193\t31193n\tgovernment\t{MNLI_PARSES}\tConceptually cream skimming has two dimensions.\tProduct and geography are what make it work.\tneutral\tneutral\n"
                     f"1\t101457\t101457e\ttelephone\t{MNLI_PARSES}\tyou know during the season\tYou lose the things.\tentailment\tentailment\n"
                     f"2\t134793\t134793c\tfiction\t{MNLI_PARSES}\tOne of our number will carry out.\tWe will not.\tcontradiction\tcontradiction\n",
        "dev_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                           "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
                           f"0\t63735\t63735n\tslate\t{MNLI_PARSES}\tThe new rights are nice enough\tEveryone really likes the newest benefits\tneutral\tentailment\tneutral\tneutral\tneutral\tneutral\n"
                           f"1\t91383\t91383c\tgovernment\t{MNLI_PARSES}\tThis site includes a list.\tThe Government site has no list.\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n"
                           f"2\t755\t755e\ttravel\t{MNLI_PARSES}\tuh i don't know.\tI like it.\tentailment\tneutral\tentailment\tentailment\tentailment\t-\n",
        "dev_mismatched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                              "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
                              f"0\t75290\t75290c\tletters\t{MNLI_PARSES}\tYour contribution helped.\tYour contributions were of no help.\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n",
        "test_matched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                            "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\n"
                            f"0\t31\t31\tgovernment\t{MNLI_PARSES}\tHierbas is a name.\tHierbas is a liquor.\n",
        "test_mismatched.tsv": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                               "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\n"
                               f"0\t1\t1\tletters\t{MNLI_PARSES}\tWhat we have done.\tWe did it.\n"
                               f"1\t2\t2\tletters\t{MNLI_PARSES}\tHelp us.\tWe need help.\n",
    },
    "QNLI": {
        "train.tsv": "index\tquestion\tsentence\tlabel\n0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it, it is darker.\tnot_entailment\n"
                     "1\tWhich missile batteries often have individual launchers?\tThe batteries often have launchers.\tentailment\n",
        "dev.tsv": "index\tquestion\tsentence\tlabel\n0\tWhat came into force after the new constitution?\tThe law came into force.\tentailment\n",
        "test.tsv": "index\tquestion\tsentence\n0\tWhat organization is devoted to Jihad?\tThe organization is devoted.\n",
    },
    "RTE": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tNo Weapons of Mass Destruction Found in Iraq Yet.\tWeapons of Mass Destruction Found in Iraq.\tnot_entailment\n"
                     "1\tA place of sorrow, after Pope John Paul II died.\tPope Benedict XVI is the new leader.\tentailment\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tDana Reeve died at 44.\tChristopher Reeve had an accident.\tnot_entailment\n",
        "test.tsv": "index\tsentence1\tsentence2\n0\tMangla was inaugurated in 1967.\tMangla was built in 1967.\n",
    },
    "WNLI": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1\n"
                     "1\tJohn could not see the stage.\tJohn is very short.\t0\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tThe drain is clogged with hair.\tThe hair has to be cleaned out.\t0\n",
        "test.tsv": "index\tsentence1\tsentence2\n0\tMaria and Susan are the only two.\tSusan is the only one.\n",
    },
    "diagnostic": {
        "diagnostic.tsv": "index\tsentence1\tsentence2\n0\tThe cat sat on the mat.\tThe cat did not sit on the mat.\n"
                          "1\tThe cat sat on the mat.\tThe mat was sat on.\n",
    },
}

TASK_OF = {"CoLA": "cola", "SST-2": "sst-2", "MRPC": "mrpc", "STS-B": "sts-b", "QQP": "qqp",
           "MNLI": "mnli", "QNLI": "qnli", "RTE": "rte", "WNLI": "wnli"}


@pytest.fixture
def glue_data(tmp_path):
    root = tmp_path / "glue_data"
    for folder, files in GLUE_DATA.items():
        (root / folder).mkdir(parents=True)
        for name, text in files.items():
            (root / folder / name).write_text(text, encoding="utf-8")
    return root


def read(task, path):
    return glue.read_glue_tsv(tasks.get_task(task), path)


# (task, file, [(eid, text, pair, label id)], skipped lines)
EXPECTED = [
    ("cola", "CoLA/train.tsv", [(0, "Our friends won't buy this analysis.", None, 1),
                                (1, "They drank the pub.", None, 0),
                                (3, 'The "quoted" word stays.', None, 1)], [3]),
    ("sst-2", "SST-2/train.tsv", [(0, "hide new secretions ", None, 0),
                                  (1, 'the greatest "musicians" ', None, 1)], [4]),
    ("mrpc", "MRPC/train.tsv", [(0, "Amrozi accused his brother .", "Referring to him , Amrozi accused .", 1),
                                (1, "Yucaipa owned \"Dominick 's\" .", "Yucaipa bought Dominick 's .", 0)], []),
    ("sts-b", "STS-B/train.tsv", [(0, "A plane is taking off.", "An air plane is taking off.", 5.0),
                                  (1, "A man plays a flute.", "A man plays a bamboo flute.", 3.8)], [4]),
    ("qqp", "QQP/train.tsv", [(0, "How is the life of a math student?", "Which is the best math book?", 0),
                              (3, "How do I control my horny emotions?", "How do you control your horniness?", 1)], [3, 4]),
    ("mnli", "MNLI/train.tsv", [(0, "Conceptually cream skimming has two dimensions.",
                                 "Product and geography are what make it work.", 1),
                                (1, "you know during the season", "You lose the things.", 0),
                                (2, "One of our number will carry out.", "We will not.", 2)], []),
    ("mnli", "MNLI/dev_matched.tsv", [(0, "The new rights are nice enough", "Everyone really likes the newest benefits", 1),
                                      (1, "This site includes a list.", "The Government site has no list.", 2)], [4]),
    ("qnli", "QNLI/train.tsv", [(0, "When did the third Digimon series begin?",
                                 "Unlike the two seasons before it, it is darker.", 1),
                                (1, "Which missile batteries often have individual launchers?",
                                 "The batteries often have launchers.", 0)], []),
    ("rte", "RTE/dev.tsv", [(0, "Dana Reeve died at 44.", "Christopher Reeve had an accident.", 1)], []),
    ("wnli", "WNLI/train.tsv", [(0, "I stuck a pin through a carrot.", "The carrot had a hole.", 1),
                                (1, "John could not see the stage.", "John is very short.", 0)], []),
]


@pytest.mark.parametrize("task,file,examples,skipped", EXPECTED, ids=[f"{t}-{f}" for t, f, _, _ in EXPECTED])
def test_labeled_files_parse_as_the_authors_read_them(glue_data, task, file, examples, skipped):
    got = read(task, glue_data / file)
    assert got.labeled
    assert [(e.eid, e.text, e.text_pair, e.label) for e in got.examples] == examples
    assert [int(loc.rsplit(":", 1)[1]) for loc, _ in got.skipped] == skipped
    # Reading by task name through the generic entry point gives the same examples.
    assert td.read_file(tasks.get_task(task), glue_data / file) == got.examples


def test_label_ids_follow_our_label_names(glue_data):
    # GLUE's "1" in MRPC is "equivalent", WNLI's "1" "entailment": our ids index label_names.
    for task, file, name in (("mrpc", "MRPC/train.tsv", "equivalent"), ("wnli", "WNLI/train.tsv", "entailment"),
                             ("cola", "CoLA/train.tsv", "acceptable"), ("sst-2", "SST-2/train.tsv", "positive"),
                             ("qqp", "QQP/train.tsv", "duplicate")):
        first_positive = next(e for e in read(task, glue_data / file).examples
                              if tasks.get_task(task).glue.file_labels[e.label] == "1")
        assert tasks.get_task(task).label_names[first_positive.label] == name


def test_skipped_rows_are_named_in_the_log(glue_data, caplog):
    with caplog.at_level("WARNING"):
        read("qqp", glue_data / "QQP/train.tsv")
    message = " ".join(r.getMessage() for r in caplog.records)
    assert f"{glue_data / 'QQP/train.tsv'}: skipped 2 malformed rows (2 examples read)" in message
    assert "line 3: 4 fields, the layout needs 6" in message and "line 4: 3 fields" in message


TESTS = [
    ("cola", "CoLA/test.tsv", [(0, "Bill whistled past the house.", None), (1, "The car honked its way.", None)]),
    ("sst-2", "SST-2/test.tsv", [(0, "uneasy mishmash of styles", None), (1, "this film 's relationship", None)]),
    ("mrpc", "MRPC/test.tsv", [(0, "PCCW 's chief will leave .", "The chief will leave PCCW ."),
                               (1, "The world 's two largest makers .", "Two makers merged .")]),
    ("sts-b", "STS-B/test.tsv", [(0, "A girl is styling her hair.", "A girl brushes her hair.")]),
    ("qqp", "QQP/test.tsv", [(0, "Would the idea work?", "Would it work?"), (1, "What is the right way?", "")]),
    ("mnli", "MNLI/test_mismatched.tsv", [(0, "What we have done.", "We did it."), (1, "Help us.", "We need help.")]),
    ("mnli", "diagnostic/diagnostic.tsv", [(0, "The cat sat on the mat.", "The cat did not sit on the mat."),
                                           (1, "The cat sat on the mat.", "The mat was sat on.")]),
    ("qnli", "QNLI/test.tsv", [(0, "What organization is devoted to Jihad?", "The organization is devoted.")]),
    ("rte", "RTE/test.tsv", [(0, "Mangla was inaugurated in 1967.", "Mangla was built in 1967.")]),
    ("wnli", "WNLI/test.tsv", [(0, "Maria and Susan are the only two.", "Susan is the only one.")]),
]


@pytest.mark.parametrize("task,file,examples", TESTS, ids=[f"{t}-{f}" for t, f, _ in TESTS])
def test_test_files_have_no_labels_and_keep_their_index(glue_data, task, file, examples):
    got = read(task, glue_data / file)
    assert not got.labeled
    assert [(e.eid, e.text, e.text_pair) for e in got.examples] == examples
    assert all(e.label is None for e in got.examples)
    # A short test row is kept (every index needs a prediction) and counted.
    assert len(got.skipped) == (1 if task == "qqp" else 0)


def test_named_columns_still_parse_and_a_wrong_file_is_named(glue_data, tmp_path):
    # A TSV with the task's own column names (as exported from TFDS) reads as before.
    own = tmp_path / "mrpc_named.tsv"
    own.write_text("sentence1\tsentence2\tlabel\nA b .\tC d .\tequivalent\nE .\tF .\t0\n")
    assert [e.label for e in td.read_file(tasks.get_task("mrpc"), own)] == [1, 0]
    # SST-2's file given for MRPC: the message names the file, line 1 and both layouts.
    with pytest.raises(ex.TaskDataError) as info:
        td.read_file(tasks.get_task("mrpc"), glue_data / "SST-2" / "train.tsv")
    message = str(info.value)
    assert message.startswith(f"{glue_data / 'SST-2' / 'train.tsv'}:1: neither the original GLUE MRPC layout")
    assert "'#1 String' at 3" in message and "['sentence', 'label']" in message
    with pytest.raises(ex.TaskDataError, match=r"CoLA/dev.tsv:1: not a GLUE MNLI file"):
        read("mnli", glue_data / "CoLA" / "dev.tsv")


def test_data_files_find_each_task_by_name(glue_data):
    for folder, task in TASK_OF.items():
        files = td.data_files(tasks.get_task(task), glue_data / folder)
        assert Path(files.train) == glue_data / folder / "train.tsv"
        if task == "mnli":
            assert {k: Path(v).name for k, v in files.dev.items()} == {
                "dev": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv"}
            assert {k: Path(v).name for k, v in files.test.items()} == {
                "MNLI-m.tsv": "test_matched.tsv", "MNLI-mm.tsv": "test_mismatched.tsv", "AX.tsv": "diagnostic.tsv"}
        else:
            assert list(files.dev) == ["dev"] and Path(files.dev["dev"]).name == "dev.tsv"
            assert {k: Path(v).name for k, v in files.test.items()} == {f"{folder}.tsv": "test.tsv"}
    # glue_data itself: the task's folder is found; explicit files win.
    files = td.data_files(tasks.get_task("rte"), glue_data, eval_path=glue_data / "RTE" / "train.tsv")
    assert Path(files.train) == glue_data / "RTE" / "train.tsv" and files.dev == {"dev": str(glue_data / "RTE" / "train.tsv")}
    (glue_data / "WNLI" / "dev.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"WNLI: no evaluation file \(looked for train.tsv and dev.tsv\)"):
        td.data_files(tasks.get_task("wnli"), glue_data / "WNLI")


def test_submission_format():
    examples = [ex.SentenceExample(7, "a"), ex.SentenceExample(3, "b")]
    assert glue.submission_lines(tasks.get_task("mrpc").glue, examples, [1, 0]) == ["index\tprediction", "7\t1", "3\t0"]
    assert glue.submission_lines(tasks.get_task("mnli").glue, examples, [0, 2])[1:] == ["7\tentailment", "3\tcontradiction"]
    assert glue.submission_lines(tasks.get_task("qnli").glue, examples, np.array([1, 0]))[1:] == ["7\tnot_entailment", "3\tentailment"]
    assert glue.submission_lines(tasks.get_task("sts-b").glue, examples, np.array([3.25, 0.5], np.float32))[1:] == ["7\t3.25", "3\t0.5"]


# ---------------------------------------------------------------------------------------
# End to end.
# ---------------------------------------------------------------------------------------


def _submission(path):
    lines = Path(path).read_text().splitlines()
    assert lines[0] == "index\tprediction"
    return [tuple(line.split("\t")) for line in lines[1:]]


@pytest.mark.slow  # one subprocess (TensorFlow start-up) and a tiny fine-tuning run
def test_binary_mrpc_data_dir_writes_the_submission(glue_data, tmp_path, vocab_file):
    out = tmp_path / "ft"
    # Paths given as ~/...: the binary expands them (HOME is tmp_path here).
    proc = subprocess.run(
        [sys.executable, "-m", "electra_tf.tools.finetune", "--task=mrpc", "--data_dir=~/glue_data/MRPC",
         "--config=electra_tiny", f"--vocab_file={vocab_file}", "--model_dir=~/ft",
         "--num_train_epochs=1", "--train_batch_size=2", "--max_seq_length=32", "--log_every_steps=1"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", HOME=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One seed: the documented layout, model_dir/best/, no seed_0/.
    assert (out / "best" / "head_config.json").exists() and not (out / "seed_0").exists()
    results = json.loads((out / "results.json").read_text())
    assert results["best_model"] == "best" and results["best_model_dir"] == str(out / "best")
    submission = out / "best" / "submission" / "MRPC.tsv"
    assert f"GLUE test predictions: {submission}" in proc.stdout
    rows = _submission(submission)
    assert [index for index, _ in rows] == ["0", "1"] and {p for _, p in rows} <= {"0", "1"}
    assert {"f1", "accuracy"} <= set(results["summary"])


def test_mnli_evaluates_both_dev_sets_and_writes_three_submissions(glue_data, tmp_path, tiny_config,
                                                                   vocab_file, monkeypatch):
    from electra_tf.convert import names
    from electra_tf.finetune import seeds
    from electra_tf.finetune.config import FinetuningConfig
    from electra_tf.finetune.saving import load_finetuned

    # Spies (each calls the real function): the checkpoint and the strategy are resolved once
    # for the run, and every seed gets that same run.
    calls, runs = [], []

    def spy(name, real):
        def call(*args, **kwargs):
            calls.append(name)
            if name == "seed":
                runs.append(args[0])
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(names, "resolve_checkpoint", spy("checkpoint", names.resolve_checkpoint))
    monkeypatch.setattr(seeds, "resolve_strategy", spy("strategy", seeds.resolve_strategy))
    monkeypatch.setattr(seeds, "finetune_seed", spy("seed", seeds.finetune_seed))
    fc = FinetuningConfig(num_train_epochs=1, train_batch_size=2, eval_batch_size=4, max_seq_length=32)
    lines = []
    results = seeds.run_seeds("mnli", tiny_config, fc, model_dir=tmp_path / "mnli", num_seeds=2,
                              data_dir=glue_data, vocab_file=vocab_file, log=lines.append)
    assert sorted(calls) == ["checkpoint", "seed", "seed", "strategy"], calls
    assert runs[0] is runs[1] and [r["seed"] for r in results["runs"]] == [0, 1]
    for run in results["runs"]:
        assert {"accuracy", "main", "dev_mismatched_accuracy"} <= set(run["best"])
        assert set(run["history"][0]) >= {"accuracy", "dev_mismatched_accuracy"}
        assert run["num_eval_examples"] == 2  # dev_matched: its row with gold label "-" skipped
    assert "dev_mismatched_accuracy" in results["summary"]
    # Several seeds: seed_<s>/ each, and model_dir/best/ the best seed's model with its submission.
    best = tmp_path / "mnli" / "best"
    assert results["best_model_dir"] == str(best) and results["best_seed"] in (0, 1)
    assert (tmp_path / "mnli" / "seed_0" / "best").is_dir() and (tmp_path / "mnli" / "seed_1" / "best").is_dir()
    assert load_finetuned(tmp_path / "mnli")[1].seed == results["best_seed"]
    assert sorted(p.name for p in (best / "submission").iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    labels = {"entailment", "neutral", "contradiction"}
    assert [i for i, _ in _submission(best / "submission" / "MNLI-mm.tsv")] == ["0", "1"]
    assert all(p in labels for _, p in _submission(best / "submission" / "AX.tsv"))
    assert (best / "predictions_dev_mismatched.jsonl").exists()
    assert any("2 dev, 1 dev_mismatched, 1 test (MNLI-m.tsv)" in line for line in lines)


def test_a_glue_task_with_other_columns_reads_a_tsv_by_those_columns(tmp_path):
    """`Task.glue` is the original files' layout only while the task reads the columns it was
    defined with: with other columns (`--text_column` ...), a TSV is read by its header names."""
    import dataclasses

    mrpc = tasks.get_task("mrpc")
    assert mrpc.glue is not None and mrpc.glue.folder == "MRPC"
    custom = dataclasses.replace(mrpc, text_column="a", text_pair_column="b", label_column="y")
    assert custom.glue is None
    path = tmp_path / "train.tsv"
    path.write_text("a\tb\ty\none\ttwo\tequivalent\n")
    assert td.read_file(custom, path) == [ex.SentenceExample(0, "one", "two", 1)]
    with pytest.raises(ex.TaskDataError, match="neither the original GLUE MRPC layout"):
        td.read_file(mrpc, path)
