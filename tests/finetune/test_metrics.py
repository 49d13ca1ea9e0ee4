"""Metric values hand-computed on small fixed inputs (derivations in the comments)."""

import math

import pytest

from electra_tf.finetune import metrics
from electra_tf.finetune.tasks import Task, generic_task, get_task


def test_accuracy_and_binary_f1():
    # TP=2 (idx 0, 3), predicted positives 2, gold positives 3: P=1, R=2/3, F1=0.8.
    assert metrics.accuracy([1, 0, 1, 1], [1, 0, 0, 1]) == pytest.approx(75.0)
    assert metrics.f1([1, 0, 1, 1], [1, 0, 0, 1]) == pytest.approx(80.0)
    assert metrics.f1([1, 1, 0], [0, 0, 0]) == 0.0
    with pytest.raises(ValueError, match="3 values but predictions has 2"):
        metrics.accuracy([1, 0, 1], [1, 0])


def test_matthews_binary_multiclass_and_undefined():
    # TP=2 TN=2 FP=1 FN=1: (2*2 - 1*1) / sqrt(3*3*3*3) = 1/3.
    assert metrics.matthews_corrcoef([1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]) == pytest.approx(100 / 3)
    # R_K: c=3, s=4, t=(2,1,1), q=(2,0,2): (12-6)/sqrt((16-8)*(16-6)) = 6/sqrt(80).
    assert metrics.matthews_corrcoef([0, 1, 2, 0], [0, 2, 2, 0]) == pytest.approx(100 * 6 / math.sqrt(80))
    assert metrics.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0  # constant prediction
    assert metrics.matthews_corrcoef([0, 1, 1, 0], [1, 0, 0, 1]) == pytest.approx(-100.0)


def test_pearson_and_spearman_with_ties():
    # dx=(-1,0,1), dy=(-5/3,1/3,4/3): sxy=3, sxx=2, syy=42/9.
    assert metrics.pearson([1, 2, 3], [2, 4, 5]) == pytest.approx(100 * 3 / math.sqrt(2 * 42 / 9))
    # Ranks with ties averaged: x -> (1, 2.5, 2.5, 4), y -> (1, 3, 2, 4); r = 4.5 / sqrt(4.5 * 5).
    assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(100 * 4.5 / math.sqrt(22.5))
    # Monotone but non-linear: Spearman is exactly 100, Pearson is not.
    assert metrics.spearman([1, 2, 3, 4], [1, 8, 27, 1000]) == pytest.approx(100.0)
    assert metrics.pearson([1, 2, 3, 4], [1, 8, 27, 1000]) < 90
    assert metrics.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_chunk_f1_bioes_and_bio():
    gold = ["B-NP", "E-NP", "O", "S-VP", "B-NP", "I-NP", "E-NP"]
    pred = ["B-NP", "E-NP", "O", "S-NP", "B-NP", "E-NP", "O"]
    assert metrics.get_chunks(gold) == [(0, 1, "NP"), (3, 3, "VP"), (4, 6, "NP")]
    # Only (0, 1, NP) matches: P = R = 1/3.
    scores = metrics.chunk_f1([gold], [pred])
    assert scores["f1"] == pytest.approx(100 / 3)
    assert metrics.tagging_accuracy([gold], [pred]) == pytest.approx(100 * 4 / 7)
    # BIO, and conlleval's rule that a type change opens a new chunk even without B-.
    assert metrics.get_chunks(["B-NP", "I-NP", "B-VP", "O", "I-PP"]) == [(0, 1, "NP"), (2, 2, "VP"), (4, 4, "PP")]
    assert metrics.get_chunks(["B-NP", "I-VP"]) == [(0, 0, "NP"), (1, 1, "VP")]
    with pytest.raises(ValueError, match="NP"):
        metrics.get_chunks(["NP"])


def test_squad_normalisation():
    assert metrics.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert metrics.normalize_answer("An apple a day, the theater.") == "apple day theater"
    assert metrics.exact_match("the Broncos", "Broncos.") == 1.0
    # pred (in, paris, france) vs gold (paris): P=1/3, R=1 -> F1=0.5.
    assert metrics.token_f1("Paris", "in Paris, France") == pytest.approx(0.5)


def _squad(qas):
    return {"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [
        {"id": qid, "question": "?", "answers": [{"text": a, "answer_start": 0} for a in answers]}
        for qid, answers in qas
    ]}]}]}


def test_squad_v1_max_over_gold_and_missing_prediction():
    data = _squad([("q1", ["Denver Broncos", "the Broncos"]), ("q2", ["Paris"]), ("q3", ["x"])])
    scores = metrics.squad_v1_scores({"q1": "Broncos", "q2": "in Paris France"}, data)
    # EM (1, 0, 0); F1 (1, 0.5, 0): q3 has no prediction and scores 0.
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(50.0)


def test_squad_v2_has_ans_no_ans_and_thresholds():
    data = _squad([("q1", ["Denver Broncos", "the Broncos"]), ("q2", []), ("q3", ["Paris"])])
    preds = {"q1": "Broncos", "q2": "", "q3": "in Paris France"}
    s = metrics.squad_v2_scores(preds, data)
    assert s["exact"] == pytest.approx(200 / 3) and s["f1"] == pytest.approx(250 / 3)
    assert (s["HasAns_exact"], s["HasAns_f1"], s["HasAns_total"]) == pytest.approx((50.0, 75.0, 2))
    assert (s["NoAns_exact"], s["NoAns_f1"], s["NoAns_total"]) == pytest.approx((100.0, 100.0, 1))
    assert "best_exact" not in s

    # q2 answered wrongly but its no-answer prob 0.9 > 0.5 turns it into "no answer" (right);
    # q3's 0.8 > 0.5 turns a partial answer into no answer (wrong).
    preds["q2"] = "something"
    na = {"q1": 0.1, "q2": 0.9, "q3": 0.8}
    s = metrics.squad_v2_scores(preds, data, na_probs=na, na_prob_thresh=0.5)
    assert s["exact"] == pytest.approx(200 / 3) and s["f1"] == pytest.approx(200 / 3)
    assert s["NoAns_exact"] == 100.0 and s["HasAns_f1"] == 50.0
    # Sweep (sorted q1, q3, q2) from 1 (all-null correct on q2): +1 at q1 (thr 0.1),
    # then EM +0 / F1 +0.5 at q3 (F1 thr 0.8), then -1 at q2.
    assert (s["best_exact"], s["best_exact_thresh"]) == pytest.approx((200 / 3, 0.1))
    assert (s["best_f1"], s["best_f1_thresh"]) == pytest.approx((250 / 3, 0.8))
    # The qid -> gold texts form gives the same numbers.
    gold = {"q1": ["Denver Broncos", "the Broncos"], "q2": [], "q3": ["Paris"]}
    assert metrics.squad_v2_scores(preds, gold, na, 0.5) == s


def test_task_metrics_main_scores():
    """Each task's metrics, found by its name or another name it has (`tasks.TASKS`); a custom
    task takes its family's."""
    mrpc = get_task("MRPC").metrics
    assert mrpc.compute([1, 0, 1, 1], [1, 0, 0, 1])["main"] == pytest.approx(77.5)
    cola = get_task("cola").metrics
    assert cola.compute([1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1])["main"] == pytest.approx(100 / 3)
    stsb = get_task("stsb").metrics
    r = stsb.compute([1, 2, 2, 3], [1, 3, 2, 4])
    assert r["main"] == pytest.approx((r["pearson"] + r["spearman"]) / 2)
    assert get_task("glue/mnli").metrics.main == ("accuracy",)
    tag = generic_task("tagging").metrics.compute([["B-NP", "E-NP"]], [["B-NP", "E-NP"]])
    assert tag["main"] == 100.0 and tag["accuracy"] == 100.0
    squad = get_task("squad2.0").metrics.compute(_squad([("q", [])]), {"q": ""})
    assert squad["main"] == 100.0
    assert generic_task("qa", version_2=True).metrics is get_task("squad").metrics
    assert generic_task("qa").metrics is get_task("squad/v1.1").metrics
    assert Task("my_sentiment", "classification").metrics.main == ("accuracy",)
    assert Task("my_similarity", "regression").metrics is get_task("sts-b").metrics
    assert get_task("glue/wnli").metrics.main == ("accuracy",)  # GLUE's ninth task
    with pytest.raises(ValueError, match="unknown task 'ax'"):
        get_task("ax")  # the diagnostic set has no training data or metric here
