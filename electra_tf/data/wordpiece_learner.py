"""TF Text's WordPiece vocabulary learner, giving the same vocabulary in a fraction of the time.

`tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset` counts the words of the texts
and hands them to `wordpiece_tokenizer_learner_lib.learn`: a binary search over a frequency
threshold, each step running `learn_with_thresh` (four rounds of counting word pieces, pure
Python). Each round counts, for every word and every start the round splits it at, each
substring from that start (`word[s:e]` for every end `e`), then walks the substrings from the
longest down, keeps those whose count is at least the threshold and takes each one's count off
all its prefixes. That walk leaves a substring exactly the count of the words in which it runs
from a split start to the word's end: every counted substring's prefixes were counted from the
same start, so by induction from the longest, what is left of a substring's count after its
longer extensions take theirs is the part no extension accounts for, the times it ended the
word. This module counts only those suffixes (one per split start, not one per substring) and
counts round 0, where every position is a split start and nothing depends on the threshold,
once for the whole search instead of once per step. Rounds 1-3 split each word greedily,
longest match first, as TF Text does.

Everything else (which words take part, the alphabet, the search bounds, how the last
vocabulary is ordered) is TF Text's own code, called as is. `tests/data/test_wordpiece_learner.py`
checks the vocabulary equals `bert_vocab_from_dataset`'s on real and synthetic corpora.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Mapping, Sequence

from absl import logging
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as tf_text_learner

# TF Text's defaults for `learn` (tensorflow_text/tools/wordpiece_vocab/
# wordpiece_tokenizer_learner_lib.py), which `bert_vocab_from_dataset` uses when given no
# `learn_params`; the vocabulary equals TF Text's for these.
_LEARN_DEFAULTS = dict(upper_thresh=int(1e7), lower_thresh=10, num_iterations=4,
                       max_input_tokens=int(5e6), max_token_length=50, max_unique_chars=1000,
                       slack_ratio=0.05, include_joiner_token=True, joiner="##")


def learn(word_counts: Mapping[str, int], vocab_size: int, reserved_tokens: Sequence[str]) -> list[str]:
    """The vocabulary TF Text's `wordpiece_tokenizer_learner_lib.learn` returns for these counts
    with its default parameters (the ones `bert_vocab_from_dataset` uses).

    Args:
      word_counts: word -> count, as TF Text's `count_words` gives them (dict order is kept:
        it breaks ties where TF Text's cut at `max_input_tokens` does).
      vocab_size: the target size (an upper bound, see TF Text's `learn`).
      reserved_tokens: tokens placed first (specials).
    """
    if not word_counts:  # (tf-text's `count_words` fails first, with StopIteration)
        raise ValueError("no words to learn a WordPiece vocabulary from")
    p = tf_text_learner.Params(vocab_size=vocab_size, reserved_tokens=list(reserved_tokens),
                               **_LEARN_DEFAULTS)
    items = list(word_counts.items())
    upper, lower = tf_text_learner.get_search_threshs(items, p.upper_thresh, p.lower_thresh)
    words = tf_text_learner.get_input_words(items, p.reserved_tokens, p.max_token_length)
    allowed_chars = tf_text_learner.get_allowed_chars(words, p.max_unique_chars)
    words = tf_text_learner.filter_input_words(words, allowed_chars, p.max_input_tokens)
    if any(p.joiner in word for word in words):
        # A word holding "##" could make one string both a whole-word and a "##" piece, which
        # TF Text counts apart (its rounds key substrings by their length without the joiner).
        # BERT's pre-tokenizer splits "#" off alone, so only word counts from elsewhere get here.
        return tf_text_learner.learn_binary_search(words, lower, upper, p)
    return _Search(words, p).run(lower, upper)


class _Search:
    """TF Text's `learn_binary_search` over `learn_with_thresh`, with round 0 counted once."""

    def __init__(self, words: list[tuple[str, int]], params):
        self.words, self.p = words, params
        self.joiner = params.joiner if params.include_joiner_token else ""
        self.chars = tf_text_learner.extract_char_tokens(words)
        self.round0 = self._suffix_counts(
            (word, count, range(len(word))) for word, count in words)

    def run(self, lower: int, upper: int) -> list[str]:
        slack = max(0.0, self.p.slack_ratio * self.p.vocab_size)
        start, step = time.time(), 0
        logging.info("Learning WordPieces from %d distinct words: a search over the count "
                     "threshold (%d-%d) of at most %d steps", len(self.words), lower, upper,
                     _most_steps(lower, upper))
        while True:  # TF Text's recursion, as a loop
            thresh = (upper + lower) // 2
            vocab = self._learn_with_thresh(thresh)
            size, step = len(vocab), step + 1
            within_slack = size <= self.p.vocab_size and self.p.vocab_size - size <= slack
            done = within_slack or lower >= upper or thresh <= 1
            if not done and size > self.p.vocab_size:
                lower = thresh + 1
            elif not done:
                upper = thresh - 1
            elapsed = time.time() - start
            logging.info("step %d: threshold %d -> %d tokens (target %d); %.1fs, %.1fs/step; "
                         "steps left: %s", step, thresh, size, self.p.vocab_size, elapsed,
                         elapsed / step, 0 if done else f"at most {_most_steps(lower, upper)}")
            if done:
                return vocab

    def _learn_with_thresh(self, thresh: int) -> list[str]:
        tokens = self._with_chars({t: c for t, c in self.round0.items() if c >= thresh})
        for _ in range(1, self.p.num_iterations):
            counts = self._suffix_counts(
                (word, count, starts) for word, count in self.words
                if (starts := self._split_starts(word, tokens)) is not None)
            tokens = self._with_chars({t: c for t, c in counts.items() if c >= thresh})
        return tf_text_learner.generate_final_vocabulary(self.p.reserved_tokens, self.chars, tokens)

    def _with_chars(self, tokens: dict[str, int]) -> dict[str, int]:
        return tf_text_learner.ensure_all_tokens_exist(
            self.chars, tokens, self.p.include_joiner_token, self.p.joiner)

    def _suffix_counts(self, splits) -> dict[str, int]:
        """token -> summed count of the words it ends, from one of the word's split starts."""
        counts, joiner = collections.defaultdict(int), self.joiner
        for word, count, starts in splits:
            for start in starts:
                counts[joiner + word[start:] if start else word] += count
        return counts

    def _split_starts(self, word: str, tokens: dict[str, int]) -> list[int] | None:
        """Where TF Text's greedy longest-match-first split (`get_split_indices`) starts each
        piece of `word`, or None when a position matches no token."""
        joiner, starts, start, n = self.joiner, [], 0, len(word)
        while start < n:
            end = n
            while end > start:
                if (joiner + word[start:end] if start else word[start:end]) in tokens:
                    break
                end -= 1
            if end == start:
                return None
            starts.append(start)
            start = end
        return starts


def _most_steps(lower: int, upper: int) -> int:
    """Steps the search takes at most from these bounds (it halves them until they meet)."""
    return int(math.log2(max(upper - lower, 0) + 1)) + 1
