"""Fine-tuning metrics, in NumPy, reported ×100 as in the ELECTRA paper.

Classification / regression: `accuracy`, `f1`, `matthews_corrcoef`, `pearson`, `spearman`.
Span QA: `squad_v1_scores` and `squad_v2_scores` reproduce the official SQuAD evaluation
scripts (answer normalisation, exact match, token F1, HasAns/NoAns splits, best threshold).
Tagging: `tagging_accuracy` and `chunk_f1` (CoNLL `conlleval` chunk rules, BIO or BIOES).
Multiple choice: `accuracy` of the chosen index.
`TaskMetrics` says which of these a task reports and which one selects the best checkpoint
(each task's in `tasks.TASKS`; the named sets at the end of this module).

Known differences from the original code (google-research/electra):
- Its `F1Scorer` counts gold positives from the *predictions*, so its "F1" equals precision.
  `f1` here is the real binary F1 (what GLUE reports for MRPC/QQP).
- Its tagging `get_span_labels` does not close a chunk on a type change or after `E-`;
  `chunk_f1` follows `conlleval`. Both agree on well-formed BIOES sequences.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
import string
from typing import Any, Callable, Mapping, Sequence

import numpy as np

# ---------------------------------------------------------------------------------------
# Classification and regression.
# ---------------------------------------------------------------------------------------


def _pair(labels, predictions, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=dtype).reshape(-1)
    p = np.asarray(predictions, dtype=dtype).reshape(-1)
    if y.shape != p.shape:
        raise ValueError(f"labels has {y.size} values but predictions has {p.size}")
    if y.size == 0:
        raise ValueError("no examples to score")
    return y, p


def accuracy(labels, predictions) -> float:
    """Percentage of predictions equal to the label."""
    y, p = _pair(labels, predictions)
    return 100.0 * float(np.mean(y == p))


def f1(labels, predictions, positive_label: int = 1) -> float:
    """Binary F1 × 100 of class `positive_label`; 0 when nothing positive is predicted correctly."""
    y, p = _pair(labels, predictions)
    true_pos = int(np.sum((p == positive_label) & (y == positive_label)))
    if true_pos == 0:
        return 0.0
    precision = true_pos / int(np.sum(p == positive_label))
    recall = true_pos / int(np.sum(y == positive_label))
    return 100.0 * 2 * precision * recall / (precision + recall)


def matthews_corrcoef(labels, predictions) -> float:
    """Matthews correlation × 100 (multiclass R_K form, = the binary phi coefficient).

    Returns 0 when undefined (a constant label or prediction vector), like scikit-learn,
    which the original used.
    """
    y, p = _pair(labels, predictions)
    classes, encoded = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.float64)  # [true, pred]
    np.add.at(confusion, (encoded[: y.size], encoded[y.size :]), 1)
    t = confusion.sum(axis=1)  # times each class truly occurred
    q = confusion.sum(axis=0)  # times each class was predicted
    c = np.trace(confusion)
    s = confusion.sum()
    denominator = np.sqrt((s * s - q @ q) * (s * s - t @ t))
    if denominator == 0:
        return 0.0
    return 100.0 * float((c * s - t @ q) / denominator)


def pearson(labels, predictions) -> float:
    """Pearson correlation × 100; 0 when either side is constant."""
    y, p = _pair(labels, predictions, dtype=np.float64)
    y = y - y.mean()
    p = p - p.mean()
    denominator = np.sqrt((y @ y) * (p @ p))
    if denominator == 0:
        return 0.0
    return 100.0 * float((y @ p) / denominator)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    ranks = np.empty(x.size, dtype=np.float64)
    start = 0
    while start < x.size:
        end = start
        while end + 1 < x.size and sorted_x[end + 1] == sorted_x[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def spearman(labels, predictions) -> float:
    """Spearman rank correlation × 100: Pearson of average ranks (ties share their mean rank)."""
    y, p = _pair(labels, predictions, dtype=np.float64)
    return pearson(_average_ranks(y), _average_ranks(p))


# ---------------------------------------------------------------------------------------
# Tagging (word-level tag sequences, e.g. CoNLL-2000 chunking with BIOES tags).
# ---------------------------------------------------------------------------------------


def tagging_accuracy(labels: Sequence[Sequence[Any]], predictions: Sequence[Sequence[Any]]) -> float:
    """Word-level accuracy × 100 over all words of all sentences."""
    flat_y, flat_p = [], []
    for i, (y, p) in enumerate(zip(labels, predictions, strict=True)):
        if len(y) != len(p):
            raise ValueError(f"sentence {i}: {len(y)} labels but {len(p)} predictions")
        flat_y.extend(y)
        flat_p.extend(p)
    return accuracy(np.array(flat_y, dtype=object), np.array(flat_p, dtype=object))


def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, sep, chunk_type = tag.partition("-")
    if not sep or prefix not in ("B", "I", "E", "S"):
        raise ValueError(f"tag {tag!r} is neither 'O' nor '<B|I|E|S>-<type>'")
    return prefix, chunk_type


def get_chunks(tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """Chunks (first word, last word, type) of a BIO or BIOES tag sequence, `conlleval` rules."""
    chunks = []
    start = None
    prev_prefix, prev_type = "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, chunk_type = _split_tag(tag)
        ends = prev_prefix in ("E", "S") or (
            prev_prefix in ("B", "I")
            and (prefix in ("B", "S", "O") or chunk_type != prev_type)
        )
        if ends and start is not None:
            chunks.append((start, i - 1, prev_type))
            start = None
        begins = prefix in ("B", "S") or (
            prefix in ("I", "E") and (prev_prefix in ("E", "S", "O") or chunk_type != prev_type)
        )
        if begins:
            start = i
        prev_prefix, prev_type = prefix, chunk_type
    return chunks


def chunk_f1(labels: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> dict[str, float]:
    """Chunk precision, recall and F1 × 100 (a chunk counts only if span and type match)."""
    n_correct = n_gold = n_predicted = 0
    for i, (y, p) in enumerate(zip(labels, predictions, strict=True)):
        if len(y) != len(p):
            raise ValueError(f"sentence {i}: {len(y)} labels but {len(p)} predictions")
        gold, pred = set(get_chunks(y)), set(get_chunks(p))
        n_correct += len(gold & pred)
        n_gold += len(gold)
        n_predicted += len(pred)
    if n_correct == 0:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    precision = 100.0 * n_correct / n_predicted
    recall = 100.0 * n_correct / n_gold
    return {"precision": precision, "recall": recall, "f1": 2 * precision * recall / (precision + recall)}


# ---------------------------------------------------------------------------------------
# SQuAD (official evaluation scripts v1.1 and v2.0).
# ---------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(gold: str, prediction: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def token_f1(gold: str, prediction: str) -> float:
    """Bag-of-normalised-tokens F1 in [0, 1]; two empty answers agree (score 1)."""
    gold_tokens = normalize_answer(gold).split()
    pred_tokens = normalize_answer(prediction).split()
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_gold_answers(dataset) -> dict[str, list[str]]:
    """qid -> gold answer texts, from a SQuAD JSON object, its "data" list, or such a mapping."""
    if isinstance(dataset, Mapping) and "data" in dataset:
        dataset = dataset["data"]
    if isinstance(dataset, Mapping):
        return {str(qid): [str(a) for a in answers] for qid, answers in dataset.items()}
    gold = {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                gold[qa["id"]] = [answer["text"] for answer in qa["answers"]]
    return gold


def _raw_scores(predictions: Mapping[str, str], gold: Mapping[str, list[str]], drop_empty_gold: bool):
    exact, f1_scores = {}, {}
    missing = [qid for qid in gold if qid not in predictions]
    if missing:
        # The official scripts print and score these as wrong; so do we, but say how many.
        logging.warning("%d questions have no prediction (scored 0), e.g. %s", len(missing), missing[0])
    for qid, answers in gold.items():
        if drop_empty_gold:
            # v2.0: answers that normalise to "" are ignored; none left means unanswerable.
            answers = [a for a in answers if normalize_answer(a)] or [""]
        prediction = predictions.get(qid)
        if prediction is None:
            exact[qid] = f1_scores[qid] = 0.0
            continue
        exact[qid] = max(exact_match(a, prediction) for a in answers)
        f1_scores[qid] = max(token_f1(a, prediction) for a in answers)
    return exact, f1_scores


def squad_v1_scores(predictions: Mapping[str, str], dataset) -> dict[str, float]:
    """SQuAD 1.1: {"exact_match", "f1"} × 100, each the max over the gold answers, averaged."""
    gold = squad_gold_answers(dataset)
    if not gold:
        raise ValueError("the SQuAD dataset has no questions")
    exact, f1_scores = _raw_scores(predictions, gold, drop_empty_gold=False)
    return {
        "exact_match": 100.0 * sum(exact.values()) / len(gold),
        "f1": 100.0 * sum(f1_scores.values()) / len(gold),
    }


def _best_threshold(predictions, scores, na_probs, has_answer) -> tuple[float, float]:
    """Official `find_best_thresh`: sweep the no-answer threshold over the sorted na_probs."""
    current = best = sum(1 for qid in scores if not has_answer[qid])
    best_threshold = 0.0
    for qid in sorted(scores, key=lambda k: na_probs[k]):
        if has_answer[qid]:
            current += scores[qid]
        elif predictions.get(qid):
            current -= 1
        if current > best:
            best, best_threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), float(best_threshold)


def squad_v2_scores(
    predictions: Mapping[str, str],
    dataset,
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """SQuAD 2.0 scores as the official v2.0 script computes them.

    Args:
      predictions: qid -> predicted answer text ("" means "no answer").
      dataset: SQuAD JSON object, its "data" list, or a qid -> gold texts mapping
        (an empty list marks an unanswerable question).
      na_probs: qid -> no-answer score (a probability, or ELECTRA's null-score difference).
        Where it exceeds `na_prob_thresh` the prediction counts as "no answer".
      na_prob_thresh: see `na_probs`; ELECTRA passes its null-score threshold -2.75.

    Returns:
      exact, f1, total; HasAns_*/NoAns_* over the answerable/unanswerable subsets; with
      `na_probs` also best_exact(_thresh), best_f1(_thresh).
    """
    gold = squad_gold_answers(dataset)
    if not gold:
        raise ValueError("the SQuAD dataset has no questions")
    has_answer = {qid: bool(answers) for qid, answers in gold.items()}
    exact_raw, f1_raw = _raw_scores(predictions, gold, drop_empty_gold=True)
    probs = {qid: 0.0 for qid in gold}
    if na_probs is not None:
        probs.update({qid: float(na_probs[qid]) for qid in gold if qid in na_probs})

    def thresholded(raw):
        return {
            qid: float(not has_answer[qid]) if probs[qid] > na_prob_thresh else score
            for qid, score in raw.items()
        }

    exact, f1_scores = thresholded(exact_raw), thresholded(f1_raw)

    def summary(qids, prefix=""):
        return {
            f"{prefix}exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            f"{prefix}f1": 100.0 * sum(f1_scores[q] for q in qids) / len(qids),
            f"{prefix}total": len(qids),
        }

    results = summary(list(gold))
    has_ans = [q for q in gold if has_answer[q]]
    no_ans = [q for q in gold if not has_answer[q]]
    if has_ans:
        results.update(summary(has_ans, "HasAns_"))
    if no_ans:
        results.update(summary(no_ans, "NoAns_"))
    if na_probs is not None:
        results["best_exact"], results["best_exact_thresh"] = _best_threshold(
            predictions, exact_raw, probs, has_answer
        )
        results["best_f1"], results["best_f1_thresh"] = _best_threshold(
            predictions, f1_raw, probs, has_answer
        )
    return results


# ---------------------------------------------------------------------------------------
# Which metrics each task reports.
# ---------------------------------------------------------------------------------------


def tagging_scores(labels: Sequence[Sequence[str]], predictions: Sequence[Sequence[str]]) -> dict[str, float]:
    """Word accuracy and chunk precision / recall / F1 (`chunk_*`) of tag-string sequences."""
    results = {"accuracy": tagging_accuracy(labels, predictions)}
    results.update({f"chunk_{k}": v for k, v in chunk_f1(labels, predictions).items()})
    return results


def _squad_v1(dataset, predictions) -> dict[str, float]:
    return squad_v1_scores(predictions, dataset)


def _squad_v2(dataset, predictions, **kwargs) -> dict[str, float]:
    return squad_v2_scores(predictions, dataset, **kwargs)


# Metrics computed one by one from label and prediction arrays.
ARRAY_METRICS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson,
                 "spearman": spearman}


@dataclasses.dataclass(frozen=True)
class TaskMetrics:
    """The metrics a task reports and the "main" score used to pick the best checkpoint (a task's
    `tasks.Task.metrics`).

    Args:
      metrics: names of the metrics reported.
      main: metrics averaged into the main score (e.g. MRPC: F1 and accuracy).
      score: `score(labels, predictions, **kwargs)` -> {metric: value} for metrics computed
        together (tagging's chunks, SQuAD's script); None computes each of `metrics` from label
        and prediction arrays (`ARRAY_METRICS`).

    Example:
      >>> r = F1_ACCURACY.compute([1, 0, 1, 1], [1, 0, 0, 1])
      >>> round(F1_ACCURACY.main_score(r), 2)  # (F1 80 + accuracy 75) / 2
      77.5
    """

    metrics: tuple[str, ...]
    main: tuple[str, ...]
    score: Callable[..., dict] | None = None

    def compute(self, labels, predictions, **kwargs) -> dict[str, float]:
        """Every metric of the task plus "main".

        Arrays of labels and predictions, unless `score` takes other forms: tagging, per-sentence
        word-level tag strings; SQuAD, the dataset and qid -> text (SQuAD 2.0 takes `na_probs`
        and `na_prob_thresh` keyword arguments).
        """
        if self.score is None:
            results = {name: ARRAY_METRICS[name](labels, predictions) for name in self.metrics}
        else:
            results = self.score(labels, predictions, **kwargs)
        results["main"] = self.main_score(results)
        return results

    def main_score(self, results: Mapping[str, float]) -> float:
        return float(np.mean([results[name] for name in self.main]))


# The metric sets of the predefined tasks (`tasks.TASKS`) and of the families' generic tasks.
ACCURACY = TaskMetrics(("accuracy",), ("accuracy",))
F1_ACCURACY = TaskMetrics(("f1", "accuracy"), ("f1", "accuracy"))  # MRPC, QQP
MCC_ACCURACY = TaskMetrics(("mcc", "accuracy"), ("mcc",))  # CoLA
CORRELATION = TaskMetrics(("pearson", "spearman"), ("pearson", "spearman"))  # STS-B, regression
TAGGING = TaskMetrics(("accuracy", "chunk_f1"), ("chunk_f1",), tagging_scores)
SQUAD_V1 = TaskMetrics(("exact_match", "f1"), ("exact_match",), _squad_v1)
SQUAD_V2 = TaskMetrics(("exact", "f1"), ("exact",), _squad_v2)
