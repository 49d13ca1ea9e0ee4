"""electra-finetune refuses what it cannot do, in one line naming the flag or file, before it
writes (or works) where that can be known: an output folder it may not write (a pretraining
run's, its starting checkpoint's, a file, a link planted at logs/ or predictions/), sizes larger
than the data or the model, task files Python's readers choke on.

The binary runs as a real process on the tiny config. Refusals of folders and flag values come
before TensorFlow loads (under a second each). What a finished model's folder refuses or keeps (a
rerun that diverges stops in one line and keeps the finished model; a killed `--overwrite` rerun
leaves the top level of model_dir describing `best/`) is checked in test_rerun_safety.py, on the
one finished run it builds for all its tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.command_lines import tree

REPO = Path(__file__).resolve().parents[2]
RUN = ["--task=rotten_tomatoes", "--config=electra_tiny", "--max_train_examples=32",
       "--max_eval_examples=16", "--num_train_epochs=2", "--train_batch_size=16",
       "--max_seq_length=32", "--log_every_steps=1"]


def start(*args) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([sys.executable, "-m", "electra_tf.tools.finetune", *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def refused(*args) -> str:
    """The one line of a refused run (exit 1, no traceback)."""
    _, err = (process := start(*args)).communicate(timeout=600)
    assert process.returncode == 1 and "Traceback" not in err, err[-3000:]
    return err.strip().splitlines()[-1]


def test_output_folders_a_run_may_not_write_are_refused_before_anything_is_written(tmp_path):
    error = "electra-finetune: error: "
    pretraining = tmp_path / "pretrain"
    pretraining.mkdir()
    for name in ("pretraining_config.json", "ckpt-10.index", "ckpt-10.data-00000-of-00001", "checkpoint"):
        (pretraining / name).write_text(name)
    (pretraining / "discriminator").mkdir()
    (pretraining / "discriminator" / "config.json").write_text("{}")
    tf1 = tmp_path / "release"
    tf1.mkdir()
    (tf1 / "model.ckpt.index").write_text("index")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    before = tree(tmp_path)

    line = refused(*RUN, f"--model_dir={pretraining}")
    assert line == (f"{error}--model_dir {pretraining} is a pretraining run folder (it holds "
                    "pretraining_config.json); fine-tuning writes best/, logs/ and results.json "
                    "there: give it a folder of its own")
    discriminator = pretraining / "discriminator"
    for model_dir, init, relation in ((discriminator, discriminator, "is"),
                                      (tmp_path, discriminator, "holds"),
                                      (tf1, tf1 / "model.ckpt", "is")):
        line = refused(*RUN, f"--init_checkpoint={init}", f"--model_dir={model_dir}")
        assert line == (f"{error}--model_dir {model_dir} {relation} the folder of --init_checkpoint "
                        f"{init}; fine-tuning would write its files among the checkpoint's: give it "
                        "a folder of its own")
    assert refused(*RUN, f"--model_dir={a_file}") == f"{error}--model_dir {a_file} exists and is not a folder"
    assert refused(*RUN, f"--model_dir={a_file}/run") == (
        f"{error}--model_dir {a_file}/run: {a_file} exists and is not a folder")
    assert tree(tmp_path) == before  # not even a lock file

    if os.geteuid() != 0:  # root writes through any mode
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert refused(*RUN, f"--model_dir={locked}/run") == (
            f"{error}--model_dir {locked}/run: cannot write in {locked} (permission denied)")


def test_links_planted_at_the_folders_a_run_makes_are_refused_and_their_targets_get_nothing(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    for planted in ("logs", "logs/train", "logs/eval", "predictions"):
        model_dir = tmp_path / planted.replace("/", "_")
        (model_dir / planted).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(victim, model_dir / planted)
        assert refused(*RUN, f"--model_dir={model_dir}") == (
            f"electra-finetune: error: {model_dir / planted} is a symbolic link; electra_tf does not "
            "write through links (remove it or give another folder)")
    model_dir = tmp_path / "file_at_logs"
    model_dir.mkdir()
    (model_dir / "logs").write_text("not a folder\n")
    assert refused(*RUN, f"--model_dir={model_dir}") == (
        f"electra-finetune: error: {model_dir / 'logs'} exists and is not a folder")
    assert list(victim.iterdir()) == []


def test_flag_values_out_of_range_are_refused_naming_the_flag(tmp_path):
    for flag, message in (("--train_batch_size=0", "0 is not a positive integer"),
                          ("--eval_batch_size=-5", "-5 is not a positive integer"),
                          ("--max_seq_length=2", "2 is not integer >= 3"),
                          ("--learning_rate=0", "--learning_rate must be a number > 0"),
                          ("--num_train_epochs=-1", "--num_train_epochs must be a number > 0")):
        name, value = flag.split("=")
        line = refused(*RUN, f"--model_dir={tmp_path / 'run'}", flag)
        assert line.startswith(f"electra-finetune: error: flag {name}=") and line.endswith(message), line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # one refused run (TensorFlow start-up, 64 examples featurized; ~15 s)
def test_a_batch_larger_than_the_training_data_is_refused_before_the_model_is_built(tmp_path, vocab_file):
    """100,000 on 64 examples warned, then grew to 19 GB and was killed for memory."""
    model_dir = tmp_path / "run"
    line = refused("--task=rotten_tomatoes", "--config=electra_tiny", f"--vocab_file={vocab_file}",
                   "--max_train_examples=64", "--max_eval_examples=16", "--max_seq_length=32",
                   "--train_batch_size=100000", f"--model_dir={model_dir}")
    assert line == ("electra-finetune: error: --train_batch_size 100000 is larger than the training "
                    "data (64 examples); give at most 64")
    assert sorted(os.listdir(model_dir)) == [".electra_tf.lock"]  # no model, staging or logs


def test_an_eval_batch_or_a_length_beyond_the_data_or_the_model_is_refused(tmp_path, tiny_config, vocab_file):
    from electra_tf.finetune.seeds import finetune

    def run(**overrides):
        with pytest.raises(ValueError) as info:
            finetune("rotten_tomatoes", tiny_config, overrides, vocab_file=vocab_file,
                     model_dir=tmp_path / "run", max_train_examples=32, max_eval_examples=16)
        return str(info.value)

    assert run(eval_batch_size=1000, max_seq_length=32) == (
        "--eval_batch_size 1000 is larger than the largest evaluation data (16 examples); give at "
        "most 16")
    assert run(max_seq_length=100000) == (
        "--max_seq_length 100000 exceeds the model's max_position_embeddings 128 (its longest "
        "input); give at most that")
    assert not (tmp_path / "run" / "best").exists()


# ---------------------------------------------------------------------------------------
# Task files Python's readers choke on.
# ---------------------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.slow  # one refused run (TensorFlow start-up; ~15 s)
def test_a_100000_deep_jsonl_line_is_one_line_naming_file_and_line(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "a fine film", "label": "pos"}\n{"text": "dull", "label": "neg"}\n'
                     f'{{"text": {DEEP}, "label": "pos"}}\n')
    line = refused("--task=classification", f"--train_file={train}", f"--eval_file={train}",
                   "--config=electra_tiny", f"--model_dir={tmp_path / 'run'}")
    assert line == (f"electra-finetune: error: {train}:3: JSON nested too deeply (more than 500 "
                    "levels of lists or objects) to be task data")


@pytest.mark.parametrize("family, name, content, message", [
    ("classification", "a.jsonl", '{"text": "x", "label": "a"}\n' + DEEP + "\n",
     ":2: JSON nested too deeply (more than 500 levels of lists or objects) to be task data"),
    ("classification", "a.jsonl", '{"text": "x", "label": "a"}\n{"text": "x", "label": ' + "9" * 5000 + "}\n",
     ":2: malformed JSON: an integer of more than 4300 digits"),
    ("classification", "a.jsonl", '{"text": "x", "label": "a"}\n["text", "label"]\n',
     ":2: expected a JSON object per line, got list"),
    ("classification", "a.jsonl", '{"text": "x", "label": "a"}\n{"text": "x", "label": {"a": 1}}\n',
     ":2: field 'label': expected a string or integer label, got {'a': 1}"),
    ("classification", "a.csv", b"text,label\nx,a\n\xff\xfe,b\n",
     ":3: not UTF-8 text (byte 0xff at column 1); save the file as UTF-8"),
    ("regression", "a.jsonl", '{"text": "x", "label": 1}\n{"text": "x", "label": ' + "9" * 400 + "}\n",
     ":2: field 'label': regression label of 400 digits is not finite as a float"),
    ("tagging", "a.jsonl", '{"tokens": ["a"], "labels": ["B"]}\n{"tokens": "ab", "labels": "BI"}\n',
     ":2: field 'tokens': expected a list of non-empty strings"),
    ("qa", "a.json", '{"data": [{"title": "t",\n "paragraphs": {"context": "abc"}}]}',
     ":1: field 'data[0].paragraphs': expected a list of objects"),
    ("qa", "a.json", '{"data": [{"paragraphs": [{"context": "abc", "qas": [\n{"id": "q", '
     '"question": "w", "answers": [1]}]}]}]}',
     ":2: field 'data[0].paragraphs[0].qas[0].answers[0]': expected an object (id q)"),
    ("qa", "a.json", '{"data":\n' + DEEP + "}",
     ":2: JSON nested too deeply (more than 500 levels of lists or objects) to be task data"),
])
def test_malformed_task_files_name_file_and_line(tmp_path, family, name, content, message):
    """Each raised RecursionError, ValueError without the file, OverflowError or AttributeError
    (a traceback from the binary) before; now TaskDataError, which the binary prints as one line
    (as the test above shows)."""
    from electra_tf.finetune.examples import TaskDataError
    from electra_tf.finetune.task_data import infer_label_names, read_file
    from electra_tf.finetune.seeds import task_from_options

    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    task = task_from_options(family)
    with pytest.raises(TaskDataError) as info:
        if family in ("classification", "tagging"):
            task = task.with_label_names(infer_label_names(task, path))
        read_file(task, path)
    assert str(info.value) == f"{path}{message}"
