"""SQuAD-style span question answering (v1.1, and v2.0 with unanswerable questions).

The authors' `finetune/qa/qa_tasks.py`: `[CLS] question [SEP] context-window [SEP]` windows every
`doc_stride` pieces (`features.featurize_qa`), the XLNet-style start / start-conditioned end
predictor with the answerability classifier (`heads.SpanQuestionAnswerer`), the n-best span
search over all windows of a question (`features.postprocess_qa`) and the official SQuAD
scripts' scores. The export searches one window in-graph (`best_spans`).
"""

from __future__ import annotations

from typing import Mapping

from electra_tf import files
from electra_tf.finetune import features as F
from electra_tf.finetune import metrics, readers
from electra_tf.finetune.config import QAOptions
from electra_tf.finetune.examples import QAAnswer, QAExample
from electra_tf.finetune.families.base import Features, TaskFamily, register_family, string_specs


@register_family
class SpanQuestionAnswering(TaskFamily):
    """SQuAD JSON files (or TFDS `squad`). Served: `question`, `context` -> `answer` string [B],
    `start` / `end` int32 [B] (character offsets in `context`, -1 if no span), `score` float32
    [B] and, for SQuAD 2.0, `no_answer_score` float32 [B]."""

    name = "qa"
    finetuning_defaults = {"max_seq_length": 512, "num_train_epochs": 2.0}  # the authors' SQuAD settings
    head = "SpanQuestionAnswerer"
    file_extensions = (".json",)

    def read_file(self, task, path):
        return readers.read_squad_json(path, v2=task.squad_v2)

    def example_from_tfds(self, task, eid, record):
        answers = record["answers"]
        texts = [readers.decode(t) for t in answers["text"]]
        starts = [int(s) for s in answers["answer_start"]]
        is_impossible = bool(record.get("is_impossible", False)) if task.squad_v2 else False
        return QAExample(
            qid=readers.decode(record["id"]),
            question=readers.decode(record["question"]),
            context=readers.decode(record["context"]),
            answers=() if is_impossible else tuple(QAAnswer(t, s) for t, s in zip(texts, starts)),
            is_impossible=is_impossible,
        )

    def unlabeled(self, examples):
        return 0  # an unanswerable question is labelled (is_impossible); the reader checks answers

    def featurize(self, task, examples, tokenizer, fc, training):
        windows = F.featurize_qa(examples, tokenizer, max_seq_length=fc.max_seq_length,
                                 max_query_length=fc.max_query_length, doc_stride=fc.doc_stride,
                                 is_training=training)
        if not windows:
            raise ValueError(f"task {task.name!r}: no QA windows (every answer was unlocatable)")
        return Features(list(examples), F.qa_windows_to_arrays(windows), windows)

    def head_options(self, task, fc):
        return {"beam_size": fc.n_best_size, "answerable_classifier": fc.answerable_classifier,
                "answerable_weight": fc.answerable_weight}

    # --- evaluation ------------------------------------------------------------------------

    def generic_metrics(self, task):
        return metrics.SQUAD_V2 if task.squad_v2 else metrics.SQUAD_V1

    def evaluate(self, task, data, outputs, fc):
        qa = F.postprocess_qa(
            data.examples, data.extra, outputs["start_logits"], outputs["end_logits"],
            outputs.get("answerable_logits") if task.squad_v2 else None,
            n_best_size=outputs["end_logits"].shape[1], max_answer_length=fc.max_answer_length,
            version_2=task.squad_v2, null_score_diff_threshold=fc.null_score_diff_threshold)
        gold = {e.qid: [a.text for a in e.answers] for e in data.examples}
        if task.squad_v2:  # thresholds best_non_null with the null odds, as the official script
            results = task.metrics.compute(gold, qa.best_non_null, na_probs=qa.null_score_diff,
                                                 na_prob_thresh=fc.null_score_diff_threshold)
        else:
            results = task.metrics.compute(gold, qa.predictions)
        return results, qa

    def write_predictions(self, records, folder, stem):
        """SQuAD's `<stem>.json` (qid -> answer) and, for 2.0, `<stem>_null_odds.json`."""
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"{stem}.json"]
        files.write_json(paths[0], records.predictions, indent=1, ensure_ascii=False)
        if records.null_score_diff:
            paths.append(folder / f"{stem}_null_odds.json")
            files.write_json(paths[1], records.null_score_diff, indent=1)
        return paths

    # --- saved model and serving ------------------------------------------------------------

    def saved_fields(self, task, fc):
        return {"qa": QAOptions.of(fc, version_2=task.squad_v2)}

    def ids_shape(self, description):
        return [None, description.max_seq_length]  # the head's top-k starts need S >= beam_size

    def serving_signature(self, head, description, pre):
        options = description.qa or QAOptions()
        if options.version_2 and not getattr(head, "answerable_classifier", False):
            raise ValueError("a SQuAD 2.0 export needs the head's answerability classifier")
        if options.max_query_length + 3 >= pre.max_seq_length:
            raise ValueError(f"head_config.json: max_query_length {options.max_query_length} leaves "
                             f"no room for the context in max_seq_length {pre.max_seq_length}")

        def serve_text(question, context):
            inputs, spans = pre.pack_qa(question, context, options.max_query_length)
            return served_answer(head(inputs, training=False), inputs, spans, context, options,
                                 min(options.n_best_size, head.beam_size))
        return serve_text, string_specs("question", "context")


def served_answer(outputs, inputs, spans, context, options, n_best: int) -> dict:
    """The text signature's outputs: the best span of one window as text and character offsets
    (`best_spans`), and for SQuAD 2.0 the null decision. `n_best` is at most the head's
    `beam_size` (end rows exist for its top starts only)."""
    import tensorflow as tf

    start, end, score, found = best_spans(outputs, inputs, n_best_size=n_best,
                                          max_answer_length=options.max_answer_length)
    first = tf.maximum(tf.cast(start, tf.int64) - spans["doc_offset"], 0)  # context piece indices
    last = tf.maximum(tf.cast(end, tf.int64) - spans["doc_offset"], 0)

    def at(name, index):
        return tf.gather(spans[name], index, batch_dims=1)

    byte_start = tf.maximum(at("byte_start", first), 0)  # -1 past the pieces: no span
    byte_end = tf.maximum(at("byte_end", last), byte_start)
    answer = tf.strings.substr(context, byte_start, byte_end - byte_start, unit="BYTE")
    result = {
        "answer": tf.where(found, answer, ""),
        "start": tf.cast(tf.where(found, at("char_start", first), -1), tf.int32),
        "end": tf.cast(tf.where(found, at("char_end", last), -1), tf.int32),
        "score": tf.where(found, score, tf.float32.min),
    }
    if options.version_2:
        no_answer = outputs["answerable_logits"]
        result["no_answer_score"] = no_answer
        result["answer"] = tf.where(no_answer > options.null_score_diff_threshold, "", result["answer"])
    return result


def _log_softmax_over(logits, allowed):
    """log-softmax over the `allowed` positions of the last axis; -inf elsewhere
    (features.postprocess_qa's `_log_softmax`)."""
    import tensorflow as tf

    return tf.nn.log_softmax(tf.where(allowed, logits, tf.constant(-float("inf"), logits.dtype)), axis=-1)


def best_spans(outputs: Mapping, inputs: Mapping, *, n_best_size: int, max_answer_length: int):
    """`features.postprocess_qa` on one window per example, in-graph: the top starts (the head's
    `start_top_index`, rank k conditioning end row k) x the top `n_best_size` ends of each row;
    both inside the context, end >= start, at most `max_answer_length` tokens; best by start +
    end log-probability. Returns (start position, end position, score, found) each [B]."""
    import tensorflow as tf

    mask = tf.cast(inputs["input_mask"], tf.bool)
    seq_length = tf.shape(mask)[1]
    position = tf.range(seq_length)[None, :]
    length = tf.reduce_sum(inputs["input_mask"], axis=1, keepdims=True)
    allowed = mask & tf.equal(inputs["segment_ids"], 1) & (position < length - 1)  # context pieces
    allowed_or_cls = allowed | tf.equal(position, 0)

    starts = outputs["start_top_index"][:, :n_best_size]  # [B, K]
    start_lp = tf.gather(_log_softmax_over(outputs["start_logits"], allowed_or_cls), starts, batch_dims=1)
    end_lp = _log_softmax_over(outputs["end_logits"][:, :n_best_size], allowed_or_cls[:, None, :])  # [B, K, S]
    end_lp, ends = tf.math.top_k(end_lp, k=tf.minimum(n_best_size, seq_length))  # [B, K, N]
    start_ok = tf.gather(allowed, starts, batch_dims=1)[:, :, None]
    end_ok = tf.gather(allowed, tf.reshape(ends, [tf.shape(ends)[0], -1]), batch_dims=1)
    end_ok = tf.reshape(end_ok, tf.shape(ends))
    valid = (start_ok & end_ok & (ends >= starts[:, :, None])
             & (ends - starts[:, :, None] + 1 <= max_answer_length))
    score = tf.where(valid, start_lp[:, :, None] + end_lp, -float("inf"))
    flat = tf.reshape(score, [tf.shape(score)[0], -1])
    best = tf.argmax(flat, axis=1, output_type=tf.int32)  # first of equals, as the stable sort
    n_ends = tf.shape(ends)[2]
    start = tf.gather(starts, best // n_ends, batch_dims=1)
    end = tf.gather(tf.reshape(ends, [tf.shape(ends)[0], -1]), best, batch_dims=1)
    found = tf.reduce_any(tf.reshape(valid, [tf.shape(valid)[0], -1]), axis=1)
    return start, end, tf.gather(flat, best, batch_dims=1), found
