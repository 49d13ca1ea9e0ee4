"""Examples -> fixed-length int32 model inputs, and span-QA predictions -> answer text.

Every input is `[CLS] A [SEP] (B [SEP])` with `segment_ids` 0 for the first part and 1 for the
second, `input_mask` 1 on real tokens, padding ([PAD] in the ids, 0 in mask and segments) to
`max_seq_length`: the three arrays `INPUT_KEYS`, what every head reads (`data/inputs.py`).

- Sentence tasks (`featurize_sentences`): pairs truncated longest-first as BERT/ELECTRA do;
  `label` int32 (class id) or float32 (regression).
- Tagging (`featurize_tagging`): a word's label sits on its first WordPiece (`label_weights` 1),
  its other pieces get weight 0; `word_positions[i]` is word i's first-piece position, so
  `word_predictions` turns per-token predictions back into per-word labels.
- Span QA (`featurize_qa`): the question (≤ `max_query_length` pieces) then windows over the
  context every `doc_stride` pieces, with each piece's word and character span in the context;
  `postprocess_qa` runs the ELECTRA/XLNet n-best span search over all windows of a question and
  returns answer text cut from the original context (plus the SQuAD 2.0 null decision).

The tokenizer is `electra_tf.data.tokenizer.WordpieceTokenizer` (anything with `tokenize_words`,
`cls_id`, `sep_id`, `pad_id`, `unk_id`; `tokenize_with_offsets` gives sub-word answer spans).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Sequence

import numpy as np

from electra_tf.data.inputs import INPUT_KEYS, pack_segments
from electra_tf.finetune.examples import QAExample, SentenceExample, TaggingExample


# ---------------------------------------------------------------------------------------
# Shared layout.
# ---------------------------------------------------------------------------------------


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Drops tokens from the end of the longer list (of `tokens_b` on ties) until they fit, in place."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def _encode_texts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    # Whitespace words tokenized one by one give the same pieces as the whole text (BERT's basic
    # tokenizer splits on whitespace first); one batched call keeps it fast.
    words = [text.split() for text in texts]
    flat = tokenizer.tokenize_words([w for ws in words for w in ws]) if any(words) else []
    out, i = [], 0
    for ws in words:
        out.append([piece for pieces in flat[i:i + len(ws)] for piece in pieces])
        i += len(ws)
    return out


def _layout(tokenizer, first: list[int], second: list[int] | None, max_seq_length: int):
    packed = pack_segments(first, second, max_seq_length, tokenizer.cls_id, tokenizer.sep_id,
                           tokenizer.pad_id)
    return {key: np.array(values, np.int32) for key, values in zip(INPUT_KEYS, packed)}


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
    firsts = _encode_texts(tokenizer, [e.text for e in examples])
    seconds = _encode_texts(tokenizer, [e.text_pair or "" for e in examples])
    features = []
    for example, a, b in zip(examples, firsts, seconds):
        if example.text_pair is not None:
            truncate_seq_pair(a, b, max_seq_length - 3)  # [CLS] A [SEP] B [SEP]
        else:
            a, b = a[: max_seq_length - 2], None  # [CLS] A [SEP]
        features.append(_layout(tokenizer, a, b, max_seq_length))
    arrays = _stack(features)
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
    features = []
    for example in examples:
        pieces = [p or [tokenizer.unk_id] for p in tokenizer.tokenize_words(list(example.words))]
        ids, positions = [], []
        for word_pieces in pieces:
            if 1 + len(ids) + len(word_pieces) + 1 > max_seq_length:
                break
            positions.append(1 + len(ids))
            ids.extend(word_pieces)
        f = _layout(tokenizer, ids, None, max_seq_length)
        labels = np.zeros(max_seq_length, np.int32)
        weights = np.zeros(max_seq_length, np.float32)
        word_positions = np.zeros(max_seq_length, np.int32)
        word_positions[: len(positions)] = positions
        weights[positions] = 1.0
        if example.labels is not None:
            labels[positions] = example.labels[: len(positions)]
        f.update(label_ids=labels, label_weights=weights, word_positions=word_positions,
                 num_words=np.int32(len(positions)))
        features.append(f)
    return _stack(features)


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


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\r\n" or ord(ch) == 0x202F  # the original also splits on NARROW NO-BREAK SPACE


def _context_words(context: str) -> tuple[list[str], list[int]]:
    """Whitespace words of the context and each word's first character offset."""
    words, starts = [], []
    previous_is_space = True
    for i, ch in enumerate(context):
        if _is_whitespace(ch):
            previous_is_space = True
            continue
        if previous_is_space:
            words.append(ch)
            starts.append(i)
        else:
            words[-1] += ch
        previous_is_space = False
    return words, starts


def _pieces_with_char_spans(tokenizer, words: list[str], word_starts: list[int]):
    """All context pieces with their word index and [start, end) characters in the context."""
    spans = None
    if hasattr(tokenizer, "tokenize_with_offsets") and words:
        import tensorflow as tf

        ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(words))
        ids, starts, ends = ids.to_list(), starts.to_list(), ends.to_list()
        spans = []
        for w, word in enumerate(words):
            encoded = word.encode("utf-8")
            to_char = lambda b: len(encoded[:b].decode("utf-8", "ignore"))  # byte -> char offset
            spans.append([(word_starts[w] + to_char(s), word_starts[w] + to_char(e))
                          for s, e in zip(starts[w], ends[w])])
    else:
        ids = tokenizer.tokenize_words(words)
    piece_ids, piece_word, piece_start, piece_end = [], [], [], []
    for w, word in enumerate(words):
        word_span = (word_starts[w], word_starts[w] + len(word))
        pieces = ids[w] or [tokenizer.unk_id]
        word_spans = spans[w] if spans is not None and ids[w] else [word_span] * len(pieces)
        for piece, (s, e) in zip(pieces, word_spans):
            piece_ids.append(piece)
            piece_word.append(w)
            piece_start.append(s)
            piece_end.append(e)
    return piece_ids, piece_word, piece_start, piece_end


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
    questions = _encode_texts(tokenizer, [e.question for e in examples])
    windows: list[QAWindow] = []
    skipped = 0
    for example_index, (example, query) in enumerate(zip(examples, questions)):
        query = query[:max_query_length]
        words, word_starts = _context_words(example.context)
        pieces, piece_word, piece_start, piece_end = _pieces_with_char_spans(tokenizer, words, word_starts)

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
            layout = _layout(tokenizer, query, pieces[start:start + length], max_seq_length)
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
            windows.append(QAWindow(example_index, example.qid, window_index, **layout,
                                    token_to_word=to_word, token_char_start=char_start,
                                    token_char_end=char_end, token_is_max_context=max_context,
                                    start_position=start_position, end_position=end_position,
                                    is_impossible=example.is_impossible))
    if skipped:
        logging.warning("skipped %d training questions whose answer is not in the context pieces", skipped)
    return windows


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
