"""Examples -> fixed-length int32 model inputs, and span-QA predictions -> answer text.

Every input is `[CLS] A [SEP] (B [SEP])` with `segment_ids` 0 for the first part and 1 for the
second, `input_mask` 1 on real tokens, padding ([PAD] in the ids, 0 in mask and segments) to
`max_seq_length`: the three arrays `INPUT_KEYS`, what every head reads (`data/inputs.py`). The
text is tokenized and packed by `data.preprocessor.TextPreprocessor`, in-graph over the whole
batch: the exported SavedModel packs a request with the same object, so training and serving
ids are equal by construction. What stays in Python here is per-example bookkeeping: labels,
QA windows and answer positions.

- Sentence tasks (`featurize_sentences`): pairs truncated longest-first as BERT/ELECTRA do;
  `label` int32 (class id) or float32 (regression).
- Tagging (`featurize_tagging`): a word's label sits on its first WordPiece (`label_weights` 1),
  its other pieces get weight 0; `word_positions[i]` is word i's first-piece position, so
  `word_predictions` turns per-token predictions back into per-word labels.
- Span QA (`featurize_qa`): the question (≤ `max_query_length` pieces) then windows over the
  context every `doc_stride` pieces, with each piece's word and character span in the context;
  `postprocess_qa` runs the ELECTRA/XLNet n-best span search over all windows of a question and
  returns answer text cut from the original context (plus the SQuAD 2.0 null decision).

The tokenizer is the fine-tuning vocabulary's `electra_tf.data.tokenizer.WordpieceTokenizer`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Sequence

import numpy as np

import tensorflow as tf

from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.data.preprocessor import TextPreprocessor
from electra_tf.finetune.examples import QAExample, SentenceExample, TaggingExample


# ---------------------------------------------------------------------------------------
# Shared layout.
# ---------------------------------------------------------------------------------------


# Rows per preprocessor call: bounds the memory of the in-graph batch on large training sets.
_CHUNK = 4096


def _numpy(inputs: dict) -> dict[str, np.ndarray]:
    return {key: value.numpy() for key, value in inputs.items()}


def _strings(texts: Sequence[str]) -> tf.Tensor:
    return tf.constant(list(texts), tf.string, shape=[len(texts)])


def _stack(features: list[dict]) -> dict[str, np.ndarray]:
    if not features:
        raise ValueError("no examples to featurize")
    return {key: np.stack([f[key] for f in features]) for key in features[0]}


# ---------------------------------------------------------------------------------------
# Sentence (pair) classification and regression.
# ---------------------------------------------------------------------------------------


def featurize_sentences(examples: Sequence[SentenceExample], tokenizer,
                        max_seq_length: int = 128) -> dict[str, np.ndarray]:
    """Examples -> {"input_ids", "input_mask", "segment_ids": int32 [N, max_seq_length], "label": [N]}.

    `label` is float32 if any label is a float (regression), else int32; unlabeled examples
    get -1 (int) / NaN (float).
    """
    if not examples:
        raise ValueError("no examples to featurize")
    pre = TextPreprocessor(tokenizer, max_seq_length)
    arrays = {key: np.zeros([len(examples), max_seq_length], np.int32) for key in INPUT_KEYS}
    pairs = np.array([e.text_pair is not None for e in examples])
    for has_pair in (False, True):  # a batch packs one layout; a task may mix both
        rows = np.flatnonzero(pairs == has_pair)
        for start in range(0, len(rows), _CHUNK):
            chunk = [examples[r] for r in rows[start:start + _CHUNK]]
            packed = pre.pack_sentences(_strings([e.text for e in chunk]),
                                        _strings([e.text_pair for e in chunk]) if has_pair else None)
            for key, value in _numpy(packed).items():
                arrays[key][rows[start:start + _CHUNK]] = value
    labels = [e.label for e in examples]
    if any(isinstance(y, float) for y in labels):
        arrays["label"] = np.array([np.nan if y is None else y for y in labels], np.float32)
    else:
        arrays["label"] = np.array([-1 if y is None else y for y in labels], np.int32)
    return arrays


# ---------------------------------------------------------------------------------------
# Tagging.
# ---------------------------------------------------------------------------------------


def featurize_tagging(examples: Sequence[TaggingExample], tokenizer,
                      max_seq_length: int = 128) -> dict[str, np.ndarray]:
    """Examples -> int32 [N, L] inputs plus per-token and per-word label layout.

    Returns (besides input_ids / input_mask / segment_ids):
      label_ids: int32 [N, L], word i's label at its first piece, 0 elsewhere.
      label_weights: float32 [N, L], 1 at first pieces of words that fit, else 0.
      word_positions: int32 [N, L], first-piece position of word i (0 past the last word).
      num_words: int32 [N], words that fit (words after the first one that does not are cut).
    Words that tokenize to nothing (e.g. a lone accent) become [UNK] so every word keeps a label.
    The original code gives tagging inputs segment id 1; we use 0 like every other single-text input.
    """
    if not examples:
        raise ValueError("no examples to featurize")
    pre = TextPreprocessor(tokenizer, max_seq_length)
    n = len(examples)
    arrays = {key: np.zeros([n, max_seq_length], np.int32) for key in INPUT_KEYS}
    arrays.update(label_ids=np.zeros([n, max_seq_length], np.int32),
                  label_weights=np.zeros([n, max_seq_length], np.float32),
                  word_positions=np.zeros([n, max_seq_length], np.int32),
                  num_words=np.zeros([n], np.int32))
    for start in range(0, n, _CHUNK):
        chunk = examples[start:start + _CHUNK]
        words = tf.RaggedTensor.from_row_lengths(
            _strings([w for e in chunk for w in e.words]), [len(e.words) for e in chunk])
        inputs, positions, num_words = pre.pack_words(words)
        for key, value in _numpy(inputs).items():
            arrays[key][start:start + len(chunk)] = value
        positions, num_words = positions.numpy(), num_words.numpy()
        for i, example in enumerate(chunk):
            row, kept = start + i, positions[i, :num_words[i]]
            arrays["word_positions"][row, :len(kept)] = kept
            arrays["label_weights"][row, kept] = 1.0
            arrays["num_words"][row] = len(kept)
            if example.labels is not None:
                arrays["label_ids"][row, kept] = example.labels[:len(kept)]
    return arrays


def word_predictions(token_predictions, word_positions, num_words) -> list[np.ndarray]:
    """Per-token predictions [N, L] (ids) or [N, L, C] (scores) -> per-word label ids, one array per example."""
    token_predictions = np.asarray(token_predictions)
    if token_predictions.ndim == 3:
        token_predictions = token_predictions.argmax(-1)
    return [token_predictions[i, word_positions[i, :n]] for i, n in enumerate(np.asarray(num_words))]


# ---------------------------------------------------------------------------------------
# Span QA: windows.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class QAWindow:
    """One model input over a window of a question's context.

    Per-position arrays are [max_seq_length]; -1 marks positions outside the context.
    `start_position`/`end_position` are the answer's token positions, 0 ([CLS]) when the window
    does not contain it or the question is unanswerable (training only; None otherwise).
    """

    example_index: int
    qid: str
    window_index: int
    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    token_to_word: np.ndarray  # whitespace-word index in the context
    token_char_start: np.ndarray  # the piece's characters are context[start:end]
    token_char_end: np.ndarray
    token_is_max_context: np.ndarray  # bool: this window gives the piece its most context
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False


def _max_context_window(windows: list[tuple[int, int]], position: int) -> int:
    """The window where `position` has the most context: max of min(left, right) + 0.01·length."""
    best, best_index = None, None
    for index, (start, length) in enumerate(windows):
        if not start <= position < start + length:
            continue
        score = min(position - start, start + length - 1 - position) + 0.01 * length
        if best is None or score > best:
            best, best_index = score, index
    return best_index


def featurize_qa(examples: Sequence[QAExample], tokenizer, *, max_seq_length: int = 512,
                 max_query_length: int = 64, doc_stride: int = 128, is_training: bool = False,
                 drop_windows_without_answer: bool = False) -> list[QAWindow]:
    """SQuAD examples -> windows `[CLS] question [SEP] context-window [SEP]`.

    Args:
      max_query_length: question pieces kept (the rest cut), 64 in ELECTRA.
      doc_stride: pieces between window starts, 128 in ELECTRA.
      is_training: fill start/end positions from `answers[0]`.
      drop_windows_without_answer: training windows that miss the answer of an answerable
        question are dropped. False (the original) keeps them with start = end = 0 ([CLS]).

    `is_impossible` is the question's, in every window (as in the original); answerable training
    examples whose answer cannot be located in the pieces are skipped with a warning.
    """
    if not examples:
        return []
    pre = TextPreprocessor(tokenizer, max_seq_length)
    queries, contexts = _qa_pieces(pre, examples, max_query_length)
    windows: list[QAWindow] = []
    layouts = []  # (question pieces, context pieces) of each window, packed in one call below
    skipped = 0
    for example_index, (example, query, context) in enumerate(zip(examples, queries, contexts)):
        pieces, piece_word = context["ids"], context["word"]
        piece_start, piece_end = context["char_start"], context["char_end"]
        answer = None
        if is_training and not example.is_impossible:
            answer = _answer_pieces(example, piece_start, piece_end)
            if answer is None:
                skipped += 1
                continue

        max_tokens_for_doc = max_seq_length - len(query) - 3  # [CLS] [SEP] [SEP]
        if max_tokens_for_doc <= 0:
            raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the context")
        spans = []  # (first piece, number of pieces)
        offset = 0
        while offset < len(pieces):
            length = min(len(pieces) - offset, max_tokens_for_doc)
            spans.append((offset, length))
            if offset + length == len(pieces):
                break
            offset += min(length, doc_stride)

        doc_offset = len(query) + 2  # position of the first context piece
        for window_index, (start, length) in enumerate(spans):
            to_word = np.full(max_seq_length, -1, np.int32)
            char_start = np.full(max_seq_length, -1, np.int32)
            char_end = np.full(max_seq_length, -1, np.int32)
            max_context = np.zeros(max_seq_length, bool)
            window = slice(doc_offset, doc_offset + length)
            to_word[window] = piece_word[start:start + length]
            char_start[window] = piece_start[start:start + length]
            char_end[window] = piece_end[start:start + length]
            max_context[window] = [_max_context_window(spans, p) == window_index
                                   for p in range(start, start + length)]
            start_position = end_position = None
            if is_training:
                start_position = end_position = 0
                if answer is not None:
                    if start <= answer[0] and answer[1] < start + length:
                        start_position = answer[0] - start + doc_offset
                        end_position = answer[1] - start + doc_offset
                    elif drop_windows_without_answer:
                        continue
            layouts.append((query, pieces[start:start + length]))
            empty = np.zeros(0, np.int32)  # the packed ids are filled in below
            windows.append(QAWindow(example_index, example.qid, window_index, empty, empty, empty,
                                    token_to_word=to_word, token_char_start=char_start,
                                    token_char_end=char_end, token_is_max_context=max_context,
                                    start_position=start_position, end_position=end_position,
                                    is_impossible=example.is_impossible))
    if skipped:
        logging.warning("skipped %d training questions whose answer is not in the context pieces", skipped)
    for start in range(0, len(windows), _CHUNK):
        chunk = layouts[start:start + _CHUNK]
        packed = _numpy(pre.pack(_ragged([q for q, _ in chunk]), _ragged([c for _, c in chunk])))
        for i, window in enumerate(windows[start:start + _CHUNK]):
            window.input_ids, window.input_mask, window.segment_ids = (
                packed[key][i] for key in INPUT_KEYS)
    return windows


def _ragged(rows: Sequence[np.ndarray]) -> tf.RaggedTensor:
    lengths = [len(r) for r in rows]
    flat = np.concatenate(rows) if sum(lengths) else np.zeros(0, np.int64)
    return tf.RaggedTensor.from_row_lengths(tf.constant(flat, tf.int64), lengths)


def _qa_pieces(pre: TextPreprocessor, examples: Sequence[QAExample], max_query_length: int):
    """(question pieces, context pieces) per example: int64 arrays, and per context a dict of
    "ids", "word", "char_start", "char_end" arrays (`TextPreprocessor.context_pieces`)."""
    queries, contexts = [], []
    for start in range(0, len(examples), _CHUNK):
        chunk = examples[start:start + _CHUNK]
        query = pre.query_pieces(_strings([e.question for e in chunk]), max_query_length)
        context = pre.context_pieces(_strings([e.context for e in chunk]))
        queries += _rows(query)
        per_key = {key: _rows(context[key]) for key in ("ids", "word", "char_start", "char_end")}
        contexts += [dict(zip(per_key, values)) for values in zip(*per_key.values())]
    return queries, contexts


def _rows(ragged: tf.RaggedTensor) -> list[np.ndarray]:
    return np.split(ragged.flat_values.numpy(), ragged.row_splits.numpy()[1:-1])


def _answer_pieces(example: QAExample, piece_start, piece_end) -> tuple[int, int] | None:
    """First and last context piece overlapping the answer's characters (None if none)."""
    if not example.answers:
        return None
    answer = example.answers[0]
    first_char, last_char = answer.answer_start, answer.answer_start + len(answer.text)
    covered = [i for i, (s, e) in enumerate(zip(piece_start, piece_end)) if s < last_char and e > first_char]
    return (covered[0], covered[-1]) if covered else None


def qa_windows_to_arrays(windows: Sequence[QAWindow]) -> dict[str, np.ndarray]:
    """Windows -> model inputs: int32 [N, L] ids/mask/segments, and for training windows
    int32 [N] start_positions / end_positions and is_impossible."""
    arrays = _stack([{"input_ids": w.input_ids, "input_mask": w.input_mask,
                      "segment_ids": w.segment_ids} for w in windows])
    if windows[0].start_position is not None:
        arrays["start_positions"] = np.array([w.start_position for w in windows], np.int32)
        arrays["end_positions"] = np.array([w.end_position for w in windows], np.int32)
        arrays["is_impossible"] = np.array([w.is_impossible for w in windows], np.int32)
    return arrays


# ---------------------------------------------------------------------------------------
# Span QA: predictions -> text.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SpanCandidate:
    text: str
    score: float  # start log-prob + end log-prob within its window
    window_index: int
    start: int  # token positions in that window
    end: int


@dataclasses.dataclass
class QAPredictions:
    """`predictions` is what to score: SQuAD 2.0 questions get "" when the null wins.

    `best_non_null` and `null_score_diff` are ELECTRA's predictions file and na-prob file:
    `metrics.squad_v2_scores(best_non_null, data, null_score_diff, threshold)` scores the same.
    """

    predictions: dict[str, str]
    best_non_null: dict[str, str]
    null_score_diff: dict[str, float]
    nbest: dict[str, list[SpanCandidate]]


def _log_softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    masked = np.where(mask, logits.astype(np.float64), -np.inf)
    top = masked.max(axis=-1, keepdims=True)
    return masked - top - np.log(np.exp(masked - top).sum(axis=-1, keepdims=True))


def _top_k(values: np.ndarray, k: int) -> np.ndarray:
    order = np.argsort(-values, kind="stable")  # ties: lower position first, like tf.math.top_k
    return order[:k]


def _window_candidates(example: QAExample, window: QAWindow, start_logits, end_logits,
                       n_best_size: int, max_answer_length: int, candidates: list) -> tuple:
    """Adds the window's spans (top starts x top ends of each, valid ones) to `candidates`;
    returns the start and end log-probabilities (end [L], or [K, L] for joint prediction)."""
    allowed = window.token_to_word >= 0
    allowed_or_cls = allowed.copy()
    allowed_or_cls[0] = True
    start_lp = _log_softmax(start_logits, allowed_or_cls)
    end_lp = _log_softmax(end_logits, allowed_or_cls)  # [L] or [K, L]
    for rank, start in enumerate(_top_k(start_lp, n_best_size)):
        row = end_lp[rank] if end_lp.ndim == 2 else end_lp
        if not (allowed[start] and window.token_is_max_context[start]):
            continue
        for end in _top_k(row, n_best_size):
            if not allowed[end] or end < start or end - start + 1 > max_answer_length:
                continue
            text = example.context[window.token_char_start[start]:window.token_char_end[end]]
            candidates.append(SpanCandidate(text, float(start_lp[start] + row[end]),
                                            window.window_index, int(start), int(end)))
    return start_lp, end_lp


def postprocess_qa(examples: Sequence[QAExample], windows: Sequence[QAWindow], start_logits,
                   end_logits, answerable_logits=None, *, n_best_size: int = 20,
                   max_answer_length: int = 30, version_2: bool = False,
                   null_score_diff_threshold: float = -2.75) -> QAPredictions:
    """Best answer per question from per-window logits (pure NumPy).

    Args:
      examples, windows: as given to / returned by `featurize_qa`.
      start_logits: [num_windows, L].
      end_logits: [num_windows, L], or [num_windows, K, L] where row k is conditioned on the start
        of rank k in that window's start logits (ELECTRA/XLNet joint prediction).
      answerable_logits: [num_windows] logit that the question is *un*answerable (ELECTRA's
        answerability classifier), or None to use the [CLS] start + end score as the null score.
      n_best_size: top starts × top ends searched per window, and candidates kept per question.
      max_answer_length: longest span in tokens.
      version_2: allow "no answer".
      null_score_diff_threshold: predict "" when the null-score difference exceeds it. With
        the classifier the difference is the lowest unanswerable logit over the windows; without
        it, the lowest [CLS] score over the windows minus the best span's score.

    Only spans with both ends inside the context, end ≥ start, length ≤ max_answer_length and a
    start at a position of maximum context are considered; positions are scored by log-softmax
    over [CLS] and the context of their window.
    """
    start_logits = np.asarray(start_logits)
    end_logits = np.asarray(end_logits)
    if len(start_logits) != len(windows) or len(end_logits) != len(windows):
        raise ValueError(f"{len(windows)} windows but {len(start_logits)} start / {len(end_logits)} end logits")
    joint = end_logits.ndim == 3
    if version_2 and joint and answerable_logits is None:
        raise ValueError("conditioned end logits [N, K, L] need answerable_logits for SQuAD 2.0")
    by_example = collections.defaultdict(list)
    for i, window in enumerate(windows):
        by_example[window.example_index].append(i)

    result = QAPredictions({}, {}, {}, {})
    for example_index, example in enumerate(examples):
        candidates: list[SpanCandidate] = []
        null_scores = []
        for i in by_example.get(example_index, []):
            start_lp, end_lp = _window_candidates(example, windows[i], start_logits[i], end_logits[i],
                                                  n_best_size, max_answer_length, candidates)
            if version_2 and answerable_logits is not None:
                null_scores.append(float(np.asarray(answerable_logits)[i]))
            elif version_2:
                null_scores.append(float(start_lp[0] + end_lp[0]))
        candidates.sort(key=lambda c: c.score, reverse=True)
        nbest, seen = [], set()
        for candidate in candidates:
            if candidate.text not in seen:
                seen.add(candidate.text)
                nbest.append(candidate)
            if len(nbest) == n_best_size:
                break
        best = nbest[0].text if nbest else ""
        result.nbest[example.qid] = nbest
        result.best_non_null[example.qid] = best
        result.predictions[example.qid] = best
        if version_2:
            null = min(null_scores) if null_scores else 0.0
            if answerable_logits is not None:
                diff = null
            else:
                diff = null - nbest[0].score if nbest else float("inf")
            result.null_score_diff[example.qid] = diff
            if diff > null_score_diff_threshold:
                result.predictions[example.qid] = ""
    return result
