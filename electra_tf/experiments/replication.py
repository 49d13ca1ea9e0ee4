"""A small-scale replication of the paper's efficiency claim (Table 5 / Figure 3 in miniature).

Every objective variant pretrains the same model (configs/electra_demo.json) on the same IMDB
shards with the SAME pretraining compute: ELECTRA's run of `electra_steps` steps sets a FLOP
budget, and each variant gets as many steps of the same batch as that budget buys (analytic
matmul FLOPs, `electra_tf.models.flops`): the BERT-style `mlm` baseline, which has no generator,
takes more steps; Electric (`variants` including "electric"), whose two-tower generator scores
every position, fewer. Checkpoints at `num_points` evenly spaced fractions of the budget are each
fine-tuned on Rotten Tomatoes with `num_seeds` seeds, each scored at its final epoch, on the dev
split, (`eval_split="tune"`) on a held-out ~15% of the training split, which is what recipes are
chosen on, or (`eval_split="cv"`) by 5-fold cross-validation over the training split (one run per
fold, every training sentence scored once, paired fold by fold across variants). Output in `workdir`:

  results.json   every fine-tuning run, per variant and compute point
  results.md     the table: median and spread of dev accuracy per variant at the full budget
  accuracy_vs_compute.png   median dev accuracy against pretraining FLOPs, one line per variant
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path

from electra_tf.experiments import demo

VARIANTS = ("electra", "mlm", "electra_15", "replace_mlm", "all_tokens_mlm")  # Table 5: the default
# Electric (Clark et al., EMNLP 2020) as one more objective at the same budget: opt-in.
ALL_VARIANTS = VARIANTS + ("electric",)
LABELS = {"random_init": "no pretraining", "electra": "ELECTRA", "mlm": "BERT (MLM)", "electra_15": "ELECTRA 15%",
          "replace_mlm": "Replace MLM", "all_tokens_mlm": "All-Tokens MLM", "electric": "Electric"}
SPLIT_LABELS = {"dev": "dev", "tune": "held-out train", "cv": "5-fold CV of train"}
PAPER_GLUE = {"random_init": "-", "electra": 85.0, "all_tokens_mlm": 84.3, "replace_mlm": 82.4, "electra_15": 82.4,
              "mlm": 82.2, "electric": "-"}  # Table 5, GLUE dev, Base size (Electric is not in it)


@dataclasses.dataclass(frozen=True)
class ReplicationConfig:
    workdir: str = "runs/replication"
    variants: tuple = VARIANTS
    # Sets every variant's budget: 12,000 ELECTRA steps of the demo model (275 TFLOP), the budget of
    # docs/replication.md's tables (the demo itself pretrains 6,000 since 2026-11-30).
    electra_steps: int = 12000
    num_points: int = 2         # fine-tuned checkpoints along the budget (1/n, 2/n, ..., 1)
    num_seeds: int = 3
    finetune_examples: int | None = None  # training sentences per fine-tuning run (None: all)
    finetune_epochs: float = demo.DemoConfig.finetune_epochs
    corpus_scale: float = 1.0   # fraction of the 25,000 IMDB reviews
    eval_split: str = "dev"     # "dev", "tune" (~15% held out of the training split) or "cv"
    recipe: tuple = ()          # (field, value) pairs replacing DemoConfig's pretraining recipe
    model_overrides: tuple = ()  # (field, value) pairs replacing the demo model's config fields
    seed: int = 0
    target_gain: float | None = None  # the chart's line above no pretraining (accuracy points)

    def __post_init__(self):
        unknown = set(self.variants) - set(ALL_VARIANTS)
        if unknown:
            raise ValueError(f"ReplicationConfig.variants: unknown {sorted(unknown)}; "
                             f"choose from {ALL_VARIANTS}")
        if self.eval_split not in SPLIT_LABELS:
            raise ValueError(f"ReplicationConfig.eval_split: one of {sorted(SPLIT_LABELS)}, "
                             f"got {self.eval_split!r}")
        recipe_fields = {"pretrain_learning_rate", "pretrain_adam_beta_2", "pretrain_warmup_fraction",
                         "pretrain_batch_size", "vocab_size", "vocab_documents_at_scale_1"}
        unknown = {k for k, _ in self.recipe} - recipe_fields
        if unknown:
            raise ValueError(f"ReplicationConfig.recipe: unknown {sorted(unknown)}; "
                             f"choose from {sorted(recipe_fields)}")
        self.demo_config()  # unknown or ill-typed model fields fail here, before any work
        if self.electra_steps < 10 or self.num_points < 1 or self.num_seeds < 1:
            raise ValueError("ReplicationConfig: electra_steps >= 10, num_points >= 1 and "
                             "num_seeds >= 1 are required")

    def demo_config(self) -> demo.DemoConfig:
        return demo.DemoConfig(workdir=self.workdir, scale=self.corpus_scale, seed=self.seed,
                               finetune_epochs=self.finetune_epochs,
                               model_overrides=self.model_overrides, **dict(self.recipe))


def steps_for_equal_compute(cfg: ReplicationConfig, vocab_file: str, seq_length: int) -> dict:
    """{variant: (steps, FLOPs per step)} so that every variant spends ELECTRA's budget."""
    from electra_tf.models.flops import training_flops_per_sequence

    batch = cfg.demo_config().pretrain_batch_size
    base = demo.model_config(vocab_file, **dict(cfg.model_overrides))
    per_step = {v: training_flops_per_sequence(base.replace(objective=v), seq_length)["training"]
                * batch for v in cfg.variants + ("electra",)}
    budget = cfg.electra_steps * per_step["electra"]
    return {v: (_round_steps(budget / per_step[v], cfg.num_points), per_step[v])
            for v in cfg.variants}


def _round_steps(steps: float, num_points: int) -> int:
    """`steps` rounded so that the `num_points` checkpoints split the run into equal parts, each a
    multiple of up to 50 steps, the largest that moves the budget by at most 0.5%: the training
    loop runs whole `steps_per_loop` chunks between checkpoints (`demo.checkpoint_cadence`), and
    22,487 steps (113 x 199) would allow only one step per call."""
    unit = next(num_points * m for m in (50, 25, 10, 5, 2, 1)
                if num_points * m <= 0.01 * steps or m == 1)
    return max(unit, unit * round(steps / unit))


def export_checkpoint(model_dir: str, step: int, folder: str, vocab_file: str) -> str:
    """The discriminator of checkpoint `ckpt-{step}` of a pretraining run, in our format."""
    from electra_tf.convert.pretrained import load_pretrained
    from electra_tf.training.loop import export_discriminator

    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    export_discriminator(load_pretrained(model_dir, "pretrainer", step=step).model, folder, vocab_file)
    return folder


def run(cfg: ReplicationConfig) -> dict:
    dcfg = cfg.demo_config()  # its data and recipe, and the models of cfg.model_overrides
    corpus_file = demo.build_corpus(dcfg)
    vocab_file = demo.build_vocab(dcfg, corpus_file)
    shards = demo.build_shards(dcfg, corpus_file, vocab_file)
    plan = steps_for_equal_compute(cfg, vocab_file, dcfg.max_seq_length)
    finetune_cfg = dataclasses.replace(
        dcfg, scale=1.0 if cfg.finetune_examples is None else min(1.0, cfg.finetune_examples / 7684))
    runs = []
    # Zero compute: the same fine-tuning from random initialisation, of the same shape.
    print("\n=== random initialisation (no pretraining) ===", flush=True)
    results = demo.finetune_rotten_tomatoes(
        finetune_cfg, vocab_file, os.path.join(cfg.workdir, f"finetune_random_{cfg.eval_split}"),
        init_checkpoint=None, num_seeds=cfg.num_seeds, eval_split=cfg.eval_split)
    runs.append({"variant": "random_init", "step": 0, "pretrain_flops": 0,
                 "accuracies": [r["best"]["accuracy"] for r in results["runs"]]})
    for variant in cfg.variants:
        steps, flops_per_step = plan[variant]
        points = [steps * k // cfg.num_points for k in range(1, cfg.num_points + 1)]
        model_dir = os.path.join(cfg.workdir, f"pretrain_{variant}")
        print(f"\n=== {LABELS[variant]}: {steps} steps x {flops_per_step / 1e9:.1f} GFLOP "
              f"(checkpoints for fine-tuning at {points}) ===", flush=True)
        demo.pretrain(dcfg, shards, vocab_file, model_dir=model_dir, num_steps=steps,
                      checkpoint_steps=points, objective=variant)
        for step in points:
            disc = export_checkpoint(model_dir, step, os.path.join(model_dir, f"disc_{step}"),
                                     vocab_file)
            results = demo.finetune_rotten_tomatoes(
                finetune_cfg, vocab_file, os.path.join(cfg.workdir, f"finetune_{variant}_{step}_{cfg.eval_split}"),
                init_checkpoint=disc, num_seeds=cfg.num_seeds, eval_split=cfg.eval_split)
            accuracies = [r["best"]["accuracy"] for r in results["runs"]]
            runs.append({"variant": variant, "step": step, "pretrain_flops": step * flops_per_step,
                         "accuracies": accuracies})
            print(point_line(variant, step, cfg.eval_split, accuracies, runs[0]["accuracies"]),
                  flush=True)
    results = {"config": dataclasses.asdict(cfg), "plan": plan, "runs": runs}
    Path(cfg.workdir, "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = results_table(runs, SPLIT_LABELS[cfg.eval_split], paired=cfg.eval_split == "cv")
    Path(cfg.workdir, "results.md").write_text(table + "\n")
    plot(runs, os.path.join(cfg.workdir, "accuracy_vs_compute.png"), SPLIT_LABELS[cfg.eval_split],
         cfg.target_gain, paired=cfg.eval_split == "cv")
    print("\n" + table)
    return results


def point_line(variant: str, step: int, split: str, accuracies, no_pretraining) -> str:
    """The line printed as each point finishes: the median over seeds, or for cross-validation
    folds the mean and the gain over no pretraining (`no_pretraining`), fold by fold."""
    if split == "cv":
        gain = statistics.mean(a - b for a, b in zip(accuracies, no_pretraining))
        centre = (f"mean {statistics.mean(accuracies):.2f} over {len(accuracies)} folds, "
                  f"gain {gain:+.2f}")
    else:
        centre = f"median {statistics.median(accuracies):.2f} over {len(accuracies)} seeds"
    return f"{LABELS[variant]} @ step {step}: {SPLIT_LABELS[split]} accuracy {centre}"


def results_table(runs, split: str = SPLIT_LABELS["dev"], paired: bool = False) -> str:
    """Markdown: per variant at its full budget, median / min / max / std of the accuracy.
    `paired`: the i-th accuracy of every variant is scored on the same sentences (cross-validation
    folds), so the verdicts add each variant's gain over no pretraining fold by fold."""
    final = {}
    for r in runs:
        if r["variant"] not in final or r["step"] > final[r["variant"]]["step"]:
            final[r["variant"]] = r
    lines = [f"| variant | pretraining steps | TFLOP | RT {split} acc. median | min | max | std | "
             "paper GLUE (Table 5) |", "|---|---|---|---|---|---|---|---|"]
    for variant, r in sorted(final.items(), key=lambda kv: -statistics.median(kv[1]["accuracies"])):
        acc = r["accuracies"]
        std = statistics.stdev(acc) if len(acc) > 1 else 0.0
        lines.append(f"| {LABELS[variant]} | {r['step']} | {r['pretrain_flops'] / 1e12:.2f} | "
                     f"{statistics.median(acc):.2f} | {min(acc):.2f} | {max(acc):.2f} | {std:.2f} | "
                     f"{PAPER_GLUE[variant]} |")
    return "\n".join(lines + [""] + verdicts(final, paired))


def verdicts(final: dict, paired: bool = False) -> list[str]:
    """The paper's claims checked on the full-budget runs, each line saying yes or no; with
    `paired` runs (`results_table`), also each variant's fold-by-fold gain over no pretraining."""
    def acc(variant):
        return final[variant]["accuracies"] if variant in final else None

    lines = []
    electra, mlm, random_init = acc("electra"), acc("mlm"), acc("random_init")
    if electra and mlm:
        lines.append(f"- ELECTRA's median above MLM's maximum at equal compute: "
                     f"{'yes' if statistics.median(electra) > max(mlm) else 'no'} "
                     f"({statistics.median(electra):.2f} vs {max(mlm):.2f})")
    for variant in ("electra", "mlm"):
        if acc(variant) and random_init:
            m, r = statistics.median(acc(variant)), statistics.median(random_init)
            lines.append(f"- {LABELS[variant]}'s median above no pretraining's: "
                         f"{'yes' if m > r else 'no'} ({m:.2f} vs {r:.2f})")
    for variant in (v for v in final if v != "random_init") if paired and random_init else ():
        gains = [a - b for a, b in zip(acc(variant), random_init)]
        spread = (f", standard error {statistics.stdev(gains) / len(gains) ** 0.5:.2f}"
                  if len(gains) > 1 else "")
        lines.append(f"- {LABELS[variant]}'s gain over no pretraining, fold by fold: mean "
                     f"{statistics.mean(gains):+.2f}{spread} (" + ", ".join(f"{g:+.2f}" for g in gains) + ")")
    return lines


def chart_lines(runs, paired: bool = False) -> tuple[float | None, dict]:
    """What `plot` draws: (no pretraining's level or None, {line label: [(TFLOP, centre, below,
    above), ...]}), each line starting at zero compute from no pretraining when there is one.

    Centre and bars are the median and min-max over seeds; with `paired` runs (cross-validation
    folds, `results_table`) the mean over folds and one standard error of the fold-by-fold gain
    over no pretraining, as the folds' own spread in difficulty cancels in that comparison."""
    baseline = [r["accuracies"] for r in runs if r["variant"] == "random_init"]
    paired = paired and bool(baseline)
    center = statistics.mean if paired else statistics.median

    def point(flops, accuracies):
        c = center(accuracies)
        if not paired:
            return flops / 1e12, c, c - min(accuracies), max(accuracies) - c
        gains = [a - b for a, b in zip(accuracies, baseline[0])]
        error = statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else 0.0
        return flops / 1e12, c, error, error

    def line(run):
        return run.get("label") or LABELS[run["variant"]]

    start = [point(0.0, baseline[0])] if baseline else []  # every curve starts at zero compute
    lines = {}
    for name in dict.fromkeys(line(r) for r in runs if r["variant"] != "random_init"):
        lines[name] = start + [point(f, a) for f, a in sorted(
            (r["pretrain_flops"], r["accuracies"]) for r in runs
            if r["variant"] != "random_init" and line(r) == name)]
    return (center(baseline[0]) if baseline else None), lines


def plot(runs, path: str, split: str = SPLIT_LABELS["dev"], target_gain: float | None = None,
         paired: bool = False) -> list[str]:
    """Draws accuracy against pretraining FLOPs (`chart_lines`: median and min-max bars, or with
    `paired` folds the mean and the gain's standard error), one line per variant, and returns the
    legend's labels. A run with a "label" is drawn on a line of its own (one variant pretrained
    with another recipe, say). `target_gain` adds a line that many points above no pretraining:
    where a curve crosses it is the crossover to read off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    level, lines = chart_lines(runs, paired)
    paired = paired and level is not None  # folds are paired with no pretraining's
    fig, ax = plt.subplots(figsize=(7, 5.5), dpi=120)
    if level is not None:
        ax.axhline(level, color="gray", linestyle="--", label=LABELS["random_init"])
        if target_gain is not None:
            ax.axhline(level + target_gain, color="gray", linestyle=":",
                       label=f"{LABELS['random_init']} + {target_gain:g} points")
    for name, points in lines.items():
        x, y, below, above = zip(*points)
        ax.errorbar(x, y, yerr=[below, above], marker="o", capsize=3, label=name)
    ax.set_xlim(left=0)
    ax.set_xlabel("pretraining compute (TFLOP, analytic matmul count)")
    ax.set_ylabel(f"Rotten Tomatoes {split} accuracy ({'mean over folds' if paired else 'median over seeds'})")
    ax.set_title("Downstream accuracy vs pretraining compute\n(bars: "
                 + ("standard error of the gain over no pretraining, fold by fold)" if paired
                    else "min-max over seeds)"))
    ax.grid(alpha=0.3)
    # Below the axes, where it hides no point or bar.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small")
    labels = ax.get_legend_handles_labels()[1]
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return labels
