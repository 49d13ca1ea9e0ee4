"""Featurization on Rotten Tomatoes text with the project tokenizer (vocab from conftest)."""

import re

import numpy as np
import pytest

from electra_tf.data.preprocessor import truncated_pair_lengths
from electra_tf.finetune import features as F
from electra_tf.finetune import metrics
from electra_tf.finetune.examples import QAAnswer, QAExample, SentenceExample, TaggingExample


def test_pair_truncation_is_longest_first():
    assert [int(n) for n in truncated_pair_lengths(10, 4, 8)] == [4, 4]
    assert [int(n) for n in truncated_pair_lengths(5, 5, 9)] == [5, 4]  # a tie trims the second text
    assert [int(n) for n in truncated_pair_lengths(2, 9, 8)] == [2, 6]


def test_sentence_pair_layout_and_truncation(tokenizer):
    a, b = "a gorgeous , witty , seductive movie .", "a bore"
    ids_a, ids_b = tokenizer.encode(a), tokenizer.encode(b)
    out = F.featurize_sentences([SentenceExample(0, a, b, 1), SentenceExample(1, a, None, 0)], tokenizer, 64)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    real = [cls, *ids_a, sep, *ids_b, sep]
    assert out["input_ids"][0, : len(real)].tolist() == real
    assert out["input_ids"][0, len(real):].tolist() == [tokenizer.pad_id] * (64 - len(real))
    assert out["segment_ids"][0].tolist() == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1) + [0] * (64 - len(real))
    assert out["input_mask"][0].sum() == len(real) and out["label"].tolist() == [1, 0]
    assert out["input_ids"].dtype == np.int32 and out["input_ids"].shape == (2, 64)
    assert out["segment_ids"][1].max() == 0 and out["input_mask"][1].sum() == len(ids_a) + 2
    # Longest first: 8 positions leave 5 pieces; the long text gives up pieces until it ties.
    short = F.featurize_sentences([SentenceExample(0, a, b, 0.5)], tokenizer, 8)
    assert short["input_ids"][0].tolist() == [cls, *ids_a[:3], sep, *ids_b[:2], sep]
    assert short["label"].dtype == np.float32


def test_tagging_labels_on_first_pieces_round_trip(tokenizer, rt_sentences):
    sentences = [s.split() for s in rt_sentences[:6]]
    examples = [TaggingExample(i, tuple(w), tuple(len(x) % 5 for x in w)) for i, w in enumerate(sentences)]
    out = F.featurize_tagging(examples, tokenizer, max_seq_length=32)
    pieces = [tokenizer.tokenize_words(w) for w in sentences]
    assert any(len(p) > 1 for ps in pieces for p in ps), "fixture vocab should split some words"
    for i, example in enumerate(examples):
        n = int(out["num_words"][i])
        expected_n, used = 0, 2
        for p in pieces[i]:
            if used + len(p) > 32:
                break
            used, expected_n = used + len(p), expected_n + 1
        assert n == expected_n
        positions = out["word_positions"][i, :n]
        assert np.flatnonzero(out["label_weights"][i]).tolist() == positions.tolist()
        # Continuation pieces sit between first pieces and carry weight 0.
        for w in range(n):
            first = positions[w]
            assert out["input_ids"][i, first] == pieces[i][w][0]
            assert out["label_weights"][i, first + 1:first + len(pieces[i][w])].sum() == 0
    assert out["num_words"][0] < len(sentences[0])  # the first review is long: words were cut
    words = F.word_predictions(out["label_ids"], out["word_positions"], out["num_words"])
    assert [w.tolist() for w in words] == [list(e.labels[: len(w)]) for e, w in zip(examples, words)]
    scores = np.eye(5)[out["label_ids"]]  # [N, L, C]
    assert all((a == b).all() for a, b in zip(F.word_predictions(scores, out["word_positions"], out["num_words"]), words))


def _detokenize(text):
    return re.sub(r" ([.,!?;:])", r"\1", text)


@pytest.fixture(scope="module")
def long_qa(rt_sentences):
    """A long context from 40 real sentences (punctuation re-attached: "film." is one word) and
    three questions whose answers are real spans: one before a period, one at the very start,
    one spanning words in the middle."""
    context = _detokenize(" ".join(rt_sentences[100:140]))
    periods = [m.start() for m in re.finditer(r"\w\.", context)]
    end = periods[len(periods) // 2] + 1  # answer ends right before a period, mid-document
    start = context.rfind(" ", 0, end - 12) + 1
    answers = [context[start:end], context.split()[0]]
    middle = context.find(" ", len(context) * 2 // 3) + 1
    answers.append(" ".join(context[middle:].split()[:3]))
    starts = [start, 0, middle]
    examples = [QAExample(f"q{i}", "what did the critic say ?", context, (QAAnswer(t, s),))
                for i, (t, s) in enumerate(zip(answers, starts))]
    assert all(context[s:s + len(t)] == t for t, s in zip(answers, starts))
    return examples


# Windows far smaller than ELECTRA's 512/128 so that 40 sentences make many; the overlap (~50
# pieces) still exceeds any answer here, as the max-context rule needs.
KW = dict(max_seq_length=96, max_query_length=16, doc_stride=32)


def test_qa_windows_stride_and_training_positions(tokenizer, long_qa):
    windows = F.featurize_qa(long_qa, tokenizer, is_training=True, **KW)
    first = [w for w in windows if w.example_index == 0]
    assert len(first) > 20  # a long document is cut into many windows
    context_pieces = len(tokenizer.encode(long_qa[0].context))
    covered = set()
    for w, nxt in zip(first, first[1:]):
        assert nxt.token_char_start[nxt.token_to_word >= 0][0] > w.token_char_start[w.token_to_word >= 0][0]
    for w in first:
        covered.update(w.token_to_word[w.token_to_word >= 0].tolist())
        assert w.input_ids.shape == (96,) and w.segment_ids[w.token_to_word >= 0].min() == 1
    assert covered == set(range(len(long_qa[0].context.split())))
    assert sum((w.token_to_word >= 0).sum() for w in first) > context_pieces  # windows overlap
    for i, example in enumerate(long_qa):
        answer_ids = tokenizer.encode(example.answers[0].text)
        hits = [w for w in windows if w.example_index == i and w.start_position > 0]
        assert hits, f"no window holds answer {i}"
        for w in hits:
            assert w.input_ids[w.start_position:w.end_position + 1].tolist() == answer_ids
    misses = [w for w in windows if w.example_index == 0 and w.start_position == 0]
    assert misses and all(w.end_position == 0 and not w.is_impossible for w in misses)
    dropped = F.featurize_qa(long_qa[:1], tokenizer, is_training=True, drop_windows_without_answer=True, **KW)
    assert len(dropped) == len([w for w in windows if w.example_index == 0 and w.start_position > 0])
    arrays = F.qa_windows_to_arrays(windows)
    assert arrays["input_ids"].shape == (len(windows), 96) and arrays["start_positions"].dtype == np.int32


def test_qa_merge_windows_recovers_answers(tokenizer, long_qa):
    train = F.featurize_qa(long_qa, tokenizer, is_training=True, **KW)
    windows = F.featurize_qa(long_qa, tokenizer, **KW)
    rng = np.random.default_rng(0)
    start = rng.normal(size=(len(windows), 96))
    end = rng.normal(size=(len(windows), 96))
    for i, (w, t) in enumerate(zip(windows, train)):
        context = np.flatnonzero(w.token_to_word >= 0)
        decoy = rng.choice(context)
        start[i, decoy] += 6.0  # every window has a confident wrong one-token answer...
        end[i, decoy] += 6.0
        if t.start_position > 0:  # ...the windows holding the answer a more confident right one
            start[i, t.start_position] += 10.0
            end[i, t.end_position] += 10.0
    out = F.postprocess_qa(long_qa, windows, start, end)
    assert out.predictions == {e.qid: e.answers[0].text for e in long_qa}
    assert not out.predictions["q0"].endswith(".")  # cut inside the word "xxx." by piece offsets
    data = {e.qid: [e.answers[0].text] for e in long_qa}
    assert metrics.squad_v1_scores(out.predictions, data)["exact_match"] == 100.0


@pytest.mark.parametrize("joint", [False, True])
def test_span_search_only_returns_valid_spans(tokenizer, long_qa, joint):
    windows = F.featurize_qa(long_qa[:2], tokenizer, **KW)
    rng = np.random.default_rng(1)
    start = rng.normal(scale=3.0, size=(len(windows), 96))
    end = rng.normal(scale=3.0, size=(len(windows), 5, 96) if joint else (len(windows), 96))
    out = F.postprocess_qa(long_qa[:2], windows, start, end, n_best_size=5, max_answer_length=4)
    by_index = {(w.example_index, w.window_index): w for w in windows}
    checked = 0
    for e_index, example in enumerate(long_qa[:2]):
        assert out.nbest[example.qid], "random logits still leave valid spans"
        scores = [c.score for c in out.nbest[example.qid]]
        assert scores == sorted(scores, reverse=True)
        for c in out.nbest[example.qid]:
            w = by_index[(e_index, c.window_index)]
            assert c.start <= c.end < c.start + 4
            assert w.token_to_word[c.start] >= 0 and w.token_to_word[c.end] >= 0
            assert w.token_is_max_context[c.start]
            assert c.text and c.text in example.context
            checked += 1
    assert checked >= 6


def test_squad2_null_answer_threshold(tokenizer):
    example = QAExample("q", "who?", "the actors are great fun .", (), is_impossible=True)
    train = F.featurize_qa([example], tokenizer, is_training=True, **KW)
    assert [(w.start_position, w.end_position, w.is_impossible) for w in train] == [(0, 0, True)]
    (window,) = F.featurize_qa([example], tokenizer, **KW)
    span = np.flatnonzero(window.token_to_word >= 0)[1]  # "actors"

    def run(null, answerable=None):
        start = np.zeros((1, 96))
        end = np.zeros((1, 96))
        start[0, 0] = end[0, 0] = null
        start[0, span] = end[0, span] = 6.0
        return F.postprocess_qa([example], [window], start, end, answerable, version_2=True)

    # Null score 2·null vs span score 12 (same window, the softmax normalisers cancel).
    loses = run(4.0)  # diff = 8 - 12 = -4 < -2.75: answer
    assert loses.predictions["q"] == "actors" and loses.null_score_diff["q"] == pytest.approx(-4.0)
    wins = run(5.0)  # diff = 10 - 12 = -2 > -2.75: no answer
    assert wins.predictions["q"] == "" and wins.best_non_null["q"] == "actors"
    assert wins.null_score_diff["q"] == pytest.approx(-2.0)
    assert run(0.0, answerable=[-1.0]).predictions["q"] == ""  # classifier: logit -1 > -2.75
    assert run(0.0, answerable=[-3.0]).predictions["q"] == "actors"
    gold = {"q": []}
    assert metrics.squad_v2_scores(wins.predictions, gold)["exact"] == 100.0
