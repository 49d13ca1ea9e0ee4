"""`learn_vocab` gives the vocabulary tf-text's `bert_vocab_from_dataset` gives, token for token.

`electra_tf/data/wordpiece_learner.py` replaces tf-text's learning step (counting only the
suffixes its prefix walk leaves a count on, and round 0 once per search); these pin that it is
the same vocabulary, in the same order, on real reviews and on corpora built to reach the
search's exits, ties between equal counts, accents, CJK, digits and punctuation.
"""

import collections
import itertools
import random

import pytest
import tensorflow as tf
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bvfd
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as tf_text_learner

from electra_tf.data import corpus, wordpiece_learner
from electra_tf.data.tokenizer import learn_vocab, special_token_layout


def tf_text_vocab(lines, vocab_size, num_unused=0, lower_case=True):
    """What `learn_vocab` ran before: tf-text's whole learner, then the same clean-up."""
    vocab = bvfd.bert_vocab_from_dataset(
        tf.data.Dataset.from_tensor_slices(lines).batch(1024), vocab_size=vocab_size,
        reserved_tokens=special_token_layout(num_unused),
        bert_tokenizer_params={"lower_case": lower_case}, learn_params={})
    return list(dict.fromkeys(t for t in vocab if t and not any(c.isspace() for c in t)))


def synthetic_lines(seed, num_lines=400):
    """Zipf-distributed words over a mixed alphabet (many equal counts, words sharing stems)."""
    rng = random.Random(seed)
    alphabet = "abcdeéfghijklmnoprstuvwxyz" + "Ünß" + "日本語" + "0123"
    stems = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(300)]
    ends = ["", "s", "ing", "ed", "er", "ly", "tion"]
    words = [s + e for s in stems for e in rng.sample(ends, 3)]
    weights = [1 / (i + 1) for i in range(len(words))]
    return [" ".join(rng.choices(words, weights, k=rng.randint(3, 25))) + rng.choice([".", "!", ", ok"])
            for _ in range(num_lines)]


@pytest.fixture(scope="module")
def imdb_lines():
    return [line for doc in itertools.islice(corpus.imdb_documents(), 80) for line in doc]


@pytest.mark.parametrize("vocab_size", [120, 420, 600, 8000])
def test_equals_tf_text_on_reviews(imdb_lines, vocab_size):
    # The search's exits on these 80 reviews: 120 within the 5% slack at its first threshold
    # (512, 119 tokens); 420 within it after narrowing (16, 416); 600 out of thresholds above
    # the size (9, 612); 8000 out of thresholds below it (9, 612: the reviews hold no more).
    assert learn_vocab(imdb_lines, vocab_size) == tf_text_vocab(imdb_lines, vocab_size)


@pytest.mark.parametrize("seed,vocab_size,num_unused,lower_case",
                         [(0, 300, 0, True), (1, 900, 3, True), (2, 500, 0, False)])
def test_equals_tf_text_on_synthetic_corpora(seed, vocab_size, num_unused, lower_case):
    lines = synthetic_lines(seed)
    ours = learn_vocab(lines, vocab_size, lower_case=lower_case, num_unused=num_unused)
    assert ours == tf_text_vocab(lines, vocab_size, num_unused, lower_case)
    assert len(ours) > len(special_token_layout(num_unused)) + 40  # pieces were learned


def test_counts_with_the_joiner_inside_words_go_to_tf_texts_own_search():
    # BERT's pre-tokenizer never leaves "#" inside a word; counts from elsewhere may.
    # Here the word "##b" and the piece "##b" (the end of "ab") are one string: counted as one
    # token they come out in another order than tf-text's (found by a random search over such
    # counts; the test fails without the fallback).
    counts = collections.Counter({"##": 14, "ab": 15, "ba#": 43, "b#": 14, "##b": 24})
    reserved = special_token_layout()
    assert wordpiece_learner.learn(counts, 12, reserved) == tf_text_learner.learn(counts, 12, reserved)
    with pytest.raises(ValueError, match="no words to learn"):
        wordpiece_learner.learn({}, 40, reserved)


def test_a_dataset_an_iterator_and_a_list_of_the_lines_learn_the_same():
    lines = synthetic_lines(3, num_lines=300)
    expected = tf_text_vocab(lines, 400)
    assert learn_vocab(tf.data.Dataset.from_tensor_slices(lines), 400) == expected
    assert learn_vocab(iter(lines), 400, batch_size=7) == expected  # a last, shorter batch
