"""electra_tf.export: every head exported, loaded in a process that imports only
tensorflow + tensorflow_text, and compared with the in-process Keras model on the inputs
`features.py` builds for the same text; the custom-op report; versions; a real server.

The heads are random-initialised tiny models whose output layers get large weights, so that
one token more or less changes the outputs far beyond the tolerances.
"""

import dataclasses
import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from electra_tf.config import ElectraConfig
from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.data.tokenizer import WordpieceTokenizer
from electra_tf.finetune import features as F
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.families import get_family
from electra_tf.finetune.examples import ChoiceExample
from electra_tf.finetune.heads import (
    MultipleChoiceClassifier, SentenceClassifier, SentenceRegressor, SpanQuestionAnswerer, TokenTagger)
from electra_tf.finetune.tasks import Task, get_task
from electra_tf.finetune.examples import QAExample, SentenceExample, TaggingExample
from electra_tf.finetune.saving import describe_finetuned, save_finetuned
from electra_tf import export as E
from electra_tf.data import preprocessor as P
from tests import reference_packing as reference

SEQ = 24
QA_SEQ = 40
WORDS = ("the a movie film great bad good is was not very it plays play actor story what who "
         "which , . ! ? ' ##s ##ed ##ing ##ly un like long short é").split()

SENTENCES = ["The movie was great!", "not a good film , very bad .", "", "Naïve café\tplays  unlikely",
             "what a long long long long long long story it is , the actor plays very well"]
PAIRS = ["it is bad", "", "great", "the film plays well", "short"]
LONG = "the actor plays a very good story , " * 4  # 32 pieces: cut to SEQ
TAGGING = ["The movie was great !", "unlikely plays é \u0301 x", "", "   spaced\u3000out  words ",
           "a b c d e f g h i j k l m n o p q r s t u v w"]
QA = [("what is the movie ?", "The movie was great , not bad . The actor plays well ."),
      ("who plays ?", "An actor plays\u202fthe lead; the story is short."),
      ("which film ?", "Naïve café films are unlikely to play long"),
      ("what ?", "")]
CHOICES = [("The movie was", ["great !", "a long story .", "not good at all"]),
           ("an actor plays", ["very well .", "the lead"]),  # two choices: the third is ""
           ("Naïve café", ["films are unlikely", "play long", "it is bad ."])]
NAMES = ["classification", "pair", "regression", "tagging", "qa", "multiple_choice"]


# ---------------------------------------------------------------------------------------
# Fixtures: vocabulary, heads saved as fine-tuning output, their exports.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *WORDS]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(vocab_file):
    return WordpieceTokenizer(vocab_file)


def _amplify(head, seed):
    """Large random weights on the head's own layers: outputs react strongly to the inputs."""
    rng = np.random.default_rng(seed)
    for layer in head.layers:
        if layer is not head.encoder and getattr(layer, "kernel", None) is not None:
            layer.kernel.assign(rng.normal(0.0, 1.0, layer.kernel.shape).astype("float32"))


def _inputs(arrays):
    return {k: tf.constant(arrays[k]) for k in INPUT_KEYS}


def _numpy(outputs):
    return {k: np.asarray(v) for k, v in outputs.items()}


class Case:
    """One head: its fine-tuning folder, its export, what to send and what to expect."""

    def __init__(self, name, head, task, fc, label_names, text_inputs, ids):
        self.name, self.head, self.task, self.fc = name, head, task, fc
        self.label_names, self.text_inputs, self.ids = label_names, text_inputs, ids
        self.keras = _numpy(head(_inputs(ids), training=False))
        self.expected = {}


def _sentence_outputs(head, keras_outputs, label_names, truncated):
    """What serving_default answers, from the Keras head's outputs and which examples were cut."""
    if head.family == "regression":
        return {"score": keras_outputs["predictions"], "truncated": truncated}
    logits = keras_outputs["logits"]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    return {"probabilities": probabilities, "label": np.array([label_names[i] for i in logits.argmax(-1)], object),
            "truncated": truncated}


def _truncated(examples, tokenizer, seq):
    """bool [N]: featurize_sentences cuts the example (its pieces do not fit `seq`)."""
    def pieces(text):
        return len(tokenizer.tokenize(tf.constant([text])).to_list()[0])

    return np.array([pieces(e.text) + (pieces(e.text_pair) + 1 if e.text_pair is not None else 0) > seq - 2
                     for e in examples])


def _sentence_case(name, head, task, tokenizer, label_names):
    pair = task.text_pair_column is not None
    examples = [SentenceExample(i, t, PAIRS[i] if pair else None, 0) for i, t in enumerate(SENTENCES)]
    ids = F.featurize_sentences(examples, tokenizer, SEQ)
    text_inputs = {"text": SENTENCES, **({"text_pair": PAIRS} if pair else {})}
    case = Case(name, head, task, FinetuningConfig(max_seq_length=SEQ), label_names, text_inputs, ids)
    case.expected = _sentence_outputs(head, case.keras, label_names, _truncated(examples, tokenizer, SEQ))
    return case


def _tagging_case(head, tokenizer, label_names):
    examples = [TaggingExample(i, tuple(t.split())) for i, t in enumerate(TAGGING)]
    ids = F.featurize_tagging(examples, tokenizer, SEQ)
    case = Case("tagging", head, Task("word_shape", "tagging", label_names), FinetuningConfig(max_seq_length=SEQ),
                label_names, {"text": TAGGING}, ids)
    words = F.word_predictions(case.keras["logits"], ids["word_positions"], ids["num_words"])
    width = max(len(w) for w in words)
    case.expected = {"labels": np.array([[label_names[i] for i in w] + [""] * (width - len(w)) for w in words], object),
                     "num_words": ids["num_words"],
                     "truncated": np.array([len(t.split()) > n for t, n in zip(TAGGING, ids["num_words"])])}
    return case


def _qa_case(head, tokenizer):
    examples = [QAExample(str(i), q, c) for i, (q, c) in enumerate(QA)]
    fc = FinetuningConfig(max_seq_length=QA_SEQ, max_query_length=8, n_best_size=head.beam_size,
                          max_answer_length=6)
    windows = F.featurize_qa(examples, tokenizer, max_seq_length=QA_SEQ, max_query_length=8, doc_stride=64)
    assert [w.example_index for w in windows] == [0, 1, 2], "one window per non-empty context"
    ids = F.qa_windows_to_arrays(windows)
    case = Case("qa", head, get_task("squad2.0"), fc, None, {"question": [q for q, _ in QA[:3]],
                                                            "context": [c for _, c in QA[:3]]}, ids)
    # A threshold between the unanswerable logits: some answers are kept, some become "".
    null = np.sort(case.keras["answerable_logits"])
    fc = dataclasses.replace(fc, null_score_diff_threshold=float(null[0] + null[1]) / 2)
    case.fc = fc
    result = F.postprocess_qa(examples[:3], windows, case.keras["start_logits"], case.keras["end_logits"],
                              case.keras["answerable_logits"], n_best_size=fc.n_best_size,
                              max_answer_length=fc.max_answer_length, version_2=True,
                              null_score_diff_threshold=fc.null_score_diff_threshold)
    best = [result.nbest[e.qid][0] for e in examples[:3]]
    case.expected = {
        "answer": np.array([result.predictions[e.qid] for e in examples[:3]], object),
        "start": np.array([w.token_char_start[b.start] for w, b in zip(windows, best)], np.int32),
        "end": np.array([w.token_char_end[b.end] for w, b in zip(windows, best)], np.int32),
        "score": np.array([b.score for b in best], np.float32),
        "no_answer_score": case.keras["answerable_logits"],
        "best_text": [b.text for b in best],
    }
    assert "" in case.expected["answer"] and any(case.expected["answer"]), "threshold splits the examples"
    return case


def _choice_case(head, tokenizer):
    examples = [ChoiceExample(i, c, tuple(choices), 0) for i, (c, choices) in enumerate(CHOICES)]
    task = Task("story_ending", "multiple_choice", text_column="context", text_pair_column="choices")
    fc = FinetuningConfig(max_seq_length=SEQ)
    ids = get_family("multiple_choice").featurize(task, examples, tokenizer, fc, training=False).arrays
    assert ids["input_ids"].shape == (3, 3, SEQ) and not ids["input_mask"][1, 2].any()
    text_inputs = {"context": [c for c, _ in CHOICES],
                   "choices": [choices + [""] * (3 - len(choices)) for _, choices in CHOICES]}
    case = Case("multiple_choice", head, task, fc, None, text_inputs, ids)
    logits = case.keras["logits"]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    choice = probabilities.argmax(-1)
    case.expected = {"probabilities": probabilities, "choice": choice.astype(np.int32),
                     "answer": np.array([CHOICES[i][1][c] for i, c in enumerate(choice)], object)}
    return case


@pytest.fixture(scope="module")
def cases(vocab_file, tokenizer):
    # Seeded encoders: the raw rows' control (one token less moves every row's answer by more
    # than 1e-3) depends on the draw, as the cased head's did (`raw_rows`).
    tf.keras.utils.set_random_seed(3)
    config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file)
    labels = ("negative", "positive")
    mrpc = ("not_equivalent", "equivalent")
    tags = ("PUNCT", "SHORT", "LONG")
    heads = {
        "classification": SentenceClassifier(config, num_labels=2),
        "pair": SentenceClassifier(config, num_labels=2),
        "regression": SentenceRegressor(config),
        "tagging": TokenTagger(config, num_labels=3),
        "qa": SpanQuestionAnswerer(config, beam_size=6),
        "multiple_choice": MultipleChoiceClassifier(config),
    }
    for seed, head in enumerate(heads.values()):
        _amplify(head, seed)
    return {
        "classification": _sentence_case("classification", heads["classification"],
                                         Task("sentiment", "classification", labels), tokenizer, labels),
        "pair": _sentence_case("pair", heads["pair"], get_task("mrpc"), tokenizer, mrpc),
        "regression": _sentence_case("regression", heads["regression"], get_task("sts-b"), tokenizer, None),
        "tagging": _tagging_case(heads["tagging"], tokenizer, tags),
        "qa": _qa_case(heads["qa"], tokenizer),
        "multiple_choice": _choice_case(heads["multiple_choice"], tokenizer),
    }


@pytest.fixture(scope="module")
def export_base(tmp_path_factory):
    return str(tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def finetuned(cases, vocab_file, tmp_path_factory):
    """Each head saved by the trainer's `save_finetuned` (a model_dir with best/ in it)."""
    root = tmp_path_factory.mktemp("finetuned")
    for name, case in cases.items():
        save_finetuned(case.head, root / name / "best", describe_finetuned(case.head, case.task, case.fc),
                       vocab_file)
    return root


@pytest.fixture(scope="module")
def exports(cases, finetuned, export_base):
    """{case: export path} written by `export_finetuned`."""
    return {name: E.export_finetuned(str(finetuned / name), export_base, name, verbose=False)
            for name in cases}


# The fresh process: only tensorflow and tensorflow_text; runs both signatures of every export.
_LOADER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session as c_api

    def registered_ops():
        ops = op_def_pb2.OpList()
        ops.ParseFromString(c_api.TF_GetBuffer(c_api.TF_GetAllOpList()))
        return {op.name for op in ops.op}

    core = registered_ops()
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops before loading)
    text_ops = registered_ops() - core

    def plain(value):
        value = value.numpy()
        if value.dtype == object:
            return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(value).tolist() if value.size else value.tolist()
        return value.tolist()

    request = json.load(open(sys.argv[1]))
    result = {"text_ops": sorted(text_ops), "models": {}}
    for name, job in request.items():
        model = tf.saved_model.load(job["path"])
        out = {}
        for signature, inputs in job["signatures"].items():
            fn = model.signatures[signature]
            tensors = {k: tf.constant(v, dtype=tf.string if signature == "serving_default" else tf.int32)
                       for k, v in inputs.items()}
            out[signature] = {k: plain(v) for k, v in fn(**tensors).items()}
        result["models"][name] = out
    result["electra_tf_imported"] = any(m.split(".")[0] == "electra_tf" for m in sys.modules)

    # As TF Serving runs an export: the MetaGraph loaded into a (TF1) Session, each signature
    # run by its SignatureDef's tensor names, the warmup file replayed through it. Also the
    # Classify / Regress signatures on tf.Examples holding the text inputs.
    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    def examples(texts):
        out = []
        for row in zip(*texts.values()):
            example = example_pb2.Example()
            for key, text in zip(texts, row):
                example.features.feature[key].bytes_list.value.append(text.encode("utf-8"))
            out.append(example.SerializeToString())
        return np.array(out, dtype=object)

    def warmup_feeds(path):
        feeds = []
        for record in tf.data.TFRecordDataset(path + "/assets.extra/tf_serving_warmup_requests"):
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            kind = log.WhichOneof("log_type")
            request = getattr(log, kind).request
            if kind == "predict_log":
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            else:
                inputs = {"inputs": np.array([e.SerializeToString() for e in request.input.example_list.examples], dtype=object)}
            feeds.append((request.model_spec.signature_name or "serving_default", inputs))
        return feeds

    # The text signatures and Classify / Regress of each family's export (`serve_ids` runs the
    # same frozen head): a Session builds an executor per signature, ~0.5 s each.
    sessions, result["session"], result["session_warmup"] = {}, {}, {}
    for name, job in request.items():
        path = job["path"]
        if not job.get("session"):
            continue
        if path not in sessions:
            graph = tf.Graph()
            with graph.as_default():
                session = tf.compat.v1.Session(graph=graph)
                meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
            sessions[path] = (session, meta.signature_def)

            def run(signature, inputs, session=session, defs=meta.signature_def):
                sig = defs[signature]
                keys = sorted(sig.outputs)
                got = session.run([sig.outputs[k].name for k in keys],
                                  {sig.inputs[k].name: v for k, v in inputs.items()})
                return {k: plain(tf.constant(v)) for k, v in zip(keys, got)}
            sessions[path] += (run,)
            # One record per signature and batch size (the local server's replay runs them all).
            kept = {(signature, len(next(iter(inputs.values())))): (signature, inputs)
                    for signature, inputs in warmup_feeds(path) if signature != "serve_ids"}
            result["session_warmup"][path] = sorted(
                [signature, size] for (signature, size), (_, inputs) in kept.items()
                if run(signature, inputs))
        _, defs, run = sessions[path]
        out = {}
        for signature, inputs in job["signatures"].items():
            if signature == "serve_ids":
                continue
            out[signature] = run(signature, {k: np.array(v, dtype=object if signature == "serving_default" else np.int32)
                                             for k, v in inputs.items()})
            api = [n for n in ("classify", "regress") if n in defs]
            if signature == "serving_default" and api:
                out[api[0]] = run(api[0], {"inputs": examples(inputs)})
        result["session"][name] = out
    json.dump(result, open(sys.argv[2], "w"))
""")


def _load_in_fresh_process(work, request: dict) -> dict:
    """`_LOADER`'s answers to `request` ({name: {"path", "signatures": {name: inputs}}}), from a
    process that does not see this repository (no PYTHONPATH)."""
    (work / "request.json").write_text(json.dumps(request))
    (work / "loader.py").write_text(_LOADER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, str(work / "loader.py"), str(work / "request.json"),
                          str(work / "result.json")], cwd=str(work), env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((work / "result.json").read_text())


@pytest.fixture(scope="module")
def fresh_process(cases, exports, raw_rows, casing_exports, tmp_path_factory):
    """One process (only tensorflow + tensorflow_text) answers for the whole file: both signatures
    of every head's export, the raw rows' exports and their controls, the casing exports."""
    work = tmp_path_factory.mktemp("loader")
    request = {name: {"path": exports[name], "session": True, "signatures": {
        "serving_default": cases[name].text_inputs,
        "serve_ids": {k: cases[name].ids[k].tolist() for k in INPUT_KEYS}}} for name in cases}
    for rows in raw_rows.values():
        request.update(rows["request"])
    for casing in casing_exports.values():
        request.update(casing["request"])
    return _load_in_fresh_process(work, request)


# ---------------------------------------------------------------------------------------
# The one preprocessor (training and serving) == the layout written out in Python (fast).
# ---------------------------------------------------------------------------------------


def test_truncated_pair_lengths_match_truncate_seq_pair():
    for budget in (0, 1, 2, 5, 6):
        for la in range(9):
            for lb in range(9):
                a, b = list(range(la)), list(range(lb))
                reference.truncate_seq_pair(a, b, budget)
                got = P.truncated_pair_lengths(tf.constant(la), tf.constant(lb), tf.constant(budget))
                assert [int(g) for g in got] == [len(a), len(b)], (la, lb, budget)


def _assert_rows(got, want_rows, err_msg=""):
    for k, key in enumerate(INPUT_KEYS):
        np.testing.assert_array_equal(np.asarray(got[key]), np.array([w[k] for w in want_rows]),
                                      err_msg=f"{key} {err_msg}")


def test_pack_sentences_equals_the_reference(tokenizer):
    pre = P.TextPreprocessor(tokenizer, 12)  # short: most pairs are truncated
    _assert_rows(pre.pack_sentences(tf.constant(SENTENCES), tf.constant(PAIRS)),
                 [reference.sentence(tokenizer, t, p, 12) for t, p in zip(SENTENCES, PAIRS)])
    _assert_rows(pre.pack_sentences(tf.constant(SENTENCES)),
                 [reference.sentence(tokenizer, t, None, 12) for t in SENTENCES])


def test_pack_sentences_to_the_longest_row(tokenizer):
    """pad_to_longest: the fixed-width arrays without the columns that pad every row."""
    pre = P.TextPreprocessor(tokenizer, SEQ)
    widths = []
    for texts, pairs in ((SENTENCES[:3], PAIRS[:3]), (SENTENCES[:3] + [LONG], PAIRS[:3] + [LONG])):
        for pair in (None, pairs):
            want = pre.pack_sentences(tf.constant(texts), tf.constant(pair) if pair else None)
            got = pre.pack_sentences(tf.constant(texts), tf.constant(pair) if pair else None, pad_to_longest=True)
            width = int(np.asarray(want["input_mask"]).sum(1).max())
            for key in INPUT_KEYS:
                np.testing.assert_array_equal(got[key], np.asarray(want[key])[:, :width], err_msg=key)
            widths.append(width)
    assert max(widths[:2]) < SEQ and widths[2:] == [SEQ, SEQ]


def test_pack_tagging_equals_the_reference(tokenizer):
    pre = P.TextPreprocessor(tokenizer, 12)
    got, positions, num_words = pre.pack_tagging(tf.constant(TAGGING))
    want = [reference.tagging(tokenizer, t.split(), 12) for t in TAGGING]
    _assert_rows(got, [packed for packed, _ in want])
    assert np.asarray(num_words).tolist() == [len(p) for _, p in want]
    assert np.asarray(positions).tolist() == [p + [0] * (positions.shape[1] - len(p)) for _, p in want]
    assert positions.shape[1] == max(len(p) for _, p in want)


def test_context_pieces_equal_the_reference(tokenizer):
    contexts = [c for _, c in QA] + ["  lead  space é ́ naïve x y ", "日本語 ok"]
    got = P.TextPreprocessor(tokenizer, 20).context_pieces(tf.constant(contexts))
    for i, context in enumerate(contexts):
        rows = [got[k][i].numpy().tolist() for k in ("ids", "word", "char_start", "char_end")]
        assert list(zip(*rows)) == reference.context_pieces(tokenizer, context), context


def test_pack_qa_equals_first_window_of_featurize_qa(tokenizer):
    pre = P.TextPreprocessor(tokenizer, 20)  # the first context is cut: its first window
    examples = [QAExample(str(i), q, c) for i, (q, c) in enumerate(QA[:3])]
    windows = F.featurize_qa(examples, tokenizer, max_seq_length=20, max_query_length=4, doc_stride=4)
    first = {w.example_index: w for w in reversed(windows)}
    got, spans = pre.pack_qa(tf.constant([q for q, _ in QA[:3]]), tf.constant([c for _, c in QA[:3]]), 4)
    for i, window in first.items():
        query = reference.pieces(tokenizer, QA[i][0])[:4]
        context = [p for p, *_ in reference.context_pieces(tokenizer, QA[i][1])][: 20 - 3 - len(query)]
        want = reference.pack_segments(query, context, 20, tokenizer.cls_id, tokenizer.sep_id)
        for k, key in enumerate(INPUT_KEYS):
            np.testing.assert_array_equal(got[key][i], getattr(window, key), err_msg=key)
            np.testing.assert_array_equal(got[key][i], want[k], err_msg=key)
        offset, n = int(spans["doc_offset"][i]), int((window.token_to_word >= 0).sum())
        np.testing.assert_array_equal(spans["char_start"][i, :n], window.token_char_start[offset:offset + n])
        np.testing.assert_array_equal(spans["char_end"][i, :n], window.token_char_end[offset:offset + n])


# ---------------------------------------------------------------------------------------
# Raw rows: the training input pipeline and the served signature see the same ids.
# ---------------------------------------------------------------------------------------

ONE_PIECE = ["movie", "film", "great", "bad", "good", "story", "actor", "plays", "long", "short", "it"]


def _raw_rows(cased: bool) -> list[tuple[str, str]]:
    """(text, text_pair) rows: pairs at the truncation limit (SEQ - 3 pieces) and one past it
    (either side longer, and a tie), an empty second text, unicode the normalisation touches
    (accents, a C1 control that glues words, CJK, emoji, NBSP, zero-width, ligature), spacing,
    case."""
    words = (ONE_PIECE * 3)
    at, past = SEQ - 3, SEQ - 2
    rows = [(" ".join(words[:11]), " ".join(words[11:at])),  # 11 + 10: exactly fits
            (" ".join(words[:12]), " ".join(words[12:past])),  # 12 + 10: the first gives one
            (" ".join(words[:9]), " ".join(words[9:past])),  # 9 + 13: the second gives one
            (" ".join(words[:11]), " ".join(words[11:past])),  # 11 + 11: a tie, the second gives one
            (" ".join(words[:30]), "it"),
            ("Naïve CAFÉ\x85plays the\u00a0lead", "ﬁlm \u200bit is 日本語 \U0001F600 e\u0301"),
            ("  The  Movie was GREAT!  ", "NOT a good film")]
    if cased:
        rows += [("The movie", "the Movie"), ("THE MOVIE", "The Movie")]
    return rows


@pytest.fixture(scope="module")
def cased_vocab_file(tmp_path_factory):
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789éÉï"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *WORDS,
             "The", "Movie", "GREAT", "NOT"]
    path = tmp_path_factory.mktemp("cased_vocab") / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def raw_rows(vocab_file, cased_vocab_file, exports, tmp_path_factory):
    """{cased: the rows' TSV read and featurized by the fine-tuning pipeline, the export that
    serves them and the fresh process's request}. Uncased, the module's `pair` export serves
    them (an amplified SentenceClassifier over `vocab_file`, uncased, with text_pair: what the
    rows' task exports to); cased, a head exported over `cased_vocab_file`."""
    from electra_tf.finetune.task_data import load_examples

    out = {}
    for cased in (False, True):
        tmp_path = tmp_path_factory.mktemp("cased_rows" if cased else "uncased_rows")
        vocab = cased_vocab_file if cased else vocab_file
        tokenizer = WordpieceTokenizer(vocab, lower_case=not cased)
        rows = _raw_rows(cased)
        task = Task("rows", "classification", ("no", "yes"), text_column="a", text_pair_column="b")
        data = tmp_path / "train.tsv"
        data.write_text("a\tb\tlabel\n" + "".join(f"{a}\t{b}\tyes\n" for a, b in rows), encoding="utf-8")
        examples = load_examples(task, "train", path=str(data))
        fc = FinetuningConfig(max_seq_length=SEQ)
        train = get_family("classification").featurize(task, examples, tokenizer, fc, training=True).arrays
        if cased:
            config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab)
            # Seeded: an unseeded encoder sometimes moved a row's answer by less than the
            # control's 1e-3 for one token less (seen in a run of the whole file).
            tf.keras.utils.set_random_seed(7)
            head = SentenceClassifier(config, num_labels=2)
            _amplify(head, 7)
            folder = tmp_path / "model"
            save_finetuned(head, folder / "best", describe_finetuned(head, task, fc, lower_case=False), vocab)
            path = E.export_finetuned(str(folder), str(tmp_path / "export"), "rows", verbose=False)
        else:
            path = exports["pair"]
        # Control: each row with its last real token dropped (one id, its mask and segment).
        probe = {key: train[key].copy() for key in INPUT_KEYS}
        last = probe["input_mask"].sum(1) - 1
        for key, value in (("input_ids", tokenizer.pad_id), ("input_mask", 0), ("segment_ids", 0)):
            probe[key][np.arange(len(rows)), last] = value
        name = "cased" if cased else "uncased"
        request = {f"rows_{name}": {"path": path, "signatures": {
            "serving_default": {"text": [e.text for e in examples], "text_pair": [e.text_pair for e in examples]},
            "serve_ids": {k: train[k].tolist() for k in INPUT_KEYS}}},
            f"probe_{name}": {"path": path, "signatures": {"serve_ids": {k: probe[k].tolist() for k in INPUT_KEYS}}}}
        out[cased] = {"rows": rows, "examples": examples, "tokenizer": tokenizer, "train": train,
                      "path": path, "request": request}
    return out


@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_raw_rows_train_and_serve_on_the_same_ids(cased, raw_rows, fresh_process):
    """Rows written to a TSV are read and featurized by the fine-tuning pipeline
    (`load_examples` + the family's `featurize`, what the trainer calls); the ids equal the
    layout written out in Python (tests/reference_packing.py). The same raw rows sent to the
    exported model's `serving_default` in a fresh process (the file's one, `fresh_process`)
    answer exactly what `serve_ids` answers for the training ids, row by row; the head's
    amplified random weights make any one id, mask or segment more or less change a row's
    answer far beyond the tolerance, which the control below checks for every row."""
    got = raw_rows[cased]
    rows, examples, tokenizer, train = got["rows"], got["examples"], got["tokenizer"], got["train"]
    assert len(examples) == len(rows)
    want = [reference.sentence(tokenizer, e.text, e.text_pair, SEQ) for e in examples]
    for k, key in enumerate(INPUT_KEYS):
        np.testing.assert_array_equal(train[key], np.array([w[k] for w in want]), err_msg=key)
    mask = train["input_mask"]
    assert mask[0].sum() == SEQ and mask[1:4].sum(1).tolist() == [SEQ] * 3  # the limit, and cut to it
    if cased:  # the vocabulary's casing reaches the ids
        assert (train["input_ids"][-2] != train["input_ids"][-1]).any()
    report = json.load(open(os.path.join(got["path"], E.EXPORT_REPORT)))
    assert (report["lower_case"], report["text_pair"]) == (not cased, True)

    name = "cased" if cased else "uncased"
    result = fresh_process["models"]
    served = np.array(result[f"rows_{name}"]["serving_default"]["probabilities"])
    trained = np.array(result[f"rows_{name}"]["serve_ids"]["logits"])
    trained = np.exp(trained - trained.max(-1, keepdims=True))
    trained /= trained.sum(-1, keepdims=True)
    np.testing.assert_allclose(served, trained, atol=1e-6)
    probed = np.array(result[f"probe_{name}"]["serve_ids"]["logits"])
    moved = np.abs(np.array(result[f"rows_{name}"]["serve_ids"]["logits"]) - probed).max(-1)
    assert (moved > 1e-3).all(), moved  # one token less shows in every row's answer


# ---------------------------------------------------------------------------------------
# Exports in a fresh process == the Keras model.
# ---------------------------------------------------------------------------------------


def test_fresh_process_imports_only_tensorflow_and_text(fresh_process):
    assert fresh_process["electra_tf_imported"] is False
    assert set(NAMES) <= set(fresh_process["models"])


def test_tf_servings_way_of_running_an_export_gives_the_same_answers(fresh_process, exports):
    """Each family's export, loaded as TF Serving loads it (a TF1 Session over the MetaGraph,
    signatures run by their tensor names; TF Serving itself cannot be installed here), answers
    the text requests as `tf.saved_model.load` does, runs a warmup record of each text signature
    and batch size, and its Classify / Regress signature on tf.Examples of the texts answers as
    `serving_default`."""
    models, session = fresh_process["models"], fresh_process["session"]
    assert set(session) == set(NAMES)
    for name in NAMES:
        for signature, want in models[name].items():
            if signature == "serve_ids":
                continue
            got = session[name][signature]
            assert set(got) == set(want), (name, signature)
            for key in want:
                if np.array(want[key]).dtype.kind == "f":
                    np.testing.assert_allclose(np.array(got[key]), np.array(want[key]), rtol=1e-6,
                                               atol=1e-6, err_msg=f"{name} {signature} {key}")
                else:
                    assert got[key] == want[key], (name, signature, key)
    for name in ("classification", "pair"):
        classify, text = session[name]["classify"], session[name]["serving_default"]
        assert classify["scores"] == text["probabilities"]
        assert [row[int(np.argmax(scores))] for row, scores in zip(classify["classes"], classify["scores"])] == text["label"]
    assert session["regression"]["regress"]["outputs"] == session["regression"]["serving_default"]["score"]
    replayed = fresh_process["session_warmup"]
    for name in NAMES:
        path = exports[name]
        signatures = {"serving_default"} | ({"classify"} if name in ("classification", "pair") else
                                           {"regress"} if name == "regression" else set())
        assert replayed[path] == sorted([s, b] for s in signatures for b in (1, 8)), name


@pytest.mark.parametrize("name", NAMES)
def test_serve_ids_equals_keras(fresh_process, cases, name):
    got = fresh_process["models"][name]["serve_ids"]
    assert set(got) == set(cases[name].keras)
    for key, want in cases[name].keras.items():
        np.testing.assert_allclose(np.array(got[key]), want, atol=2e-4, rtol=1e-4, err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_serving_default_equals_keras(fresh_process, cases, name):
    got = fresh_process["models"][name]["serving_default"]
    want = dict(cases[name].expected)
    best_text = want.pop("best_text", None)
    assert set(got) == set(want)
    for key, value in want.items():
        if value.dtype in (object, bool):
            assert got[key] == value.tolist(), key
        else:
            np.testing.assert_allclose(np.array(got[key]), value, atol=2e-4, rtol=1e-4, err_msg=key)
    if name == "qa":  # start/end index the context; the kept answers are exactly that text
        for (_, context), start, end, answer, text in zip(QA, got["start"], got["end"], got["answer"], best_text):
            assert context[start:end] == text and answer in ("", text)


def test_qa_without_a_span(exports):
    import tensorflow_text  # noqa: F401

    fn = tf.saved_model.load(exports["qa"]).signatures["serving_default"]
    got = fn(question=tf.constant(["what ?", "who ?"]), context=tf.constant(["", " \t "]))
    assert got["answer"].numpy().tolist() == [b"", b""]
    assert got["start"].numpy().tolist() == [-1, -1] and got["end"].numpy().tolist() == [-1, -1]
    assert (got["score"].numpy() == np.finfo(np.float32).min).all()


def test_two_inputs_with_different_row_counts_are_refused_naming_both(exports):
    """A pair, a question and its context, a context and its choices: rows that do not match are
    refused in the graph, naming both inputs and their counts (they failed deep in the packing
    with "Incompatible shapes"); so are choices with no column."""
    import tensorflow_text  # noqa: F401

    calls = {"pair": {"text": ["a", "b"], "text_pair": ["c"]},
             "qa": {"question": ["what ?"], "context": ["the film", "a story"]},
             "multiple_choice": {"context": ["the film", "x"], "choices": [["a", "b"]]}}
    for name, inputs in calls.items():
        fn = tf.saved_model.load(exports[name]).signatures["serving_default"]
        first, second = inputs
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"{first} and {second} must have the same number of rows; got\] \[{len(inputs[first])}\] \[and\] \[{len(inputs[second])}\]"):
            fn(**{k: tf.constant(v) for k, v in inputs.items()})
        even = {k: tf.constant(v[:1]) for k, v in inputs.items()}
        assert all(v.shape[0] == 1 for v in fn(**even).values())
    with pytest.raises(tf.errors.InvalidArgumentError, match="choices needs at least one column"):
        fn(context=tf.constant(["the film"]), choices=tf.zeros([1, 0], tf.string))


def test_label_strings_and_shapes(fresh_process, cases):
    got = fresh_process["models"]
    assert set(got["classification"]["serving_default"]["label"]) <= {"negative", "positive"}
    assert set(got["pair"]["serving_default"]["label"]) <= {"not_equivalent", "equivalent"}
    labels = got["tagging"]["serving_default"]["labels"]
    assert [len([x for x in row if x]) for row in labels] == got["tagging"]["serving_default"]["num_words"]
    assert got["tagging"]["serving_default"]["num_words"][2] == 0 and labels[2] == [""] * len(labels[2])


# ---------------------------------------------------------------------------------------
# Signatures, assets, custom-op report.
# ---------------------------------------------------------------------------------------


def test_signatures_and_assets(exports, vocab_file):
    report = json.load(open(os.path.join(exports["pair"], E.EXPORT_REPORT)))
    assert report["signatures"]["serving_default"] == {
        "inputs": {"text": "string[?]", "text_pair": "string[?]"},
        "outputs": {"label": "string[?]", "probabilities": "float32[?, 2]", "truncated": "bool[?]"}}
    assert report["signatures"]["serve_ids"]["inputs"] == {k: "int32[?, ?]" for k in INPUT_KEYS}
    assert list(json.load(open(os.path.join(exports["classification"], E.EXPORT_REPORT)))
                ["signatures"]["serving_default"]["inputs"]) == ["text"]
    qa = json.load(open(os.path.join(exports["qa"], E.EXPORT_REPORT)))["signatures"]
    assert set(qa["serving_default"]["inputs"]) == {"question", "context"}
    assert set(qa["serving_default"]["outputs"]) == {"answer", "start", "end", "score", "no_answer_score"}
    assert qa["serve_ids"]["inputs"]["input_ids"] == f"int32[?, {QA_SEQ}]"
    with open(os.path.join(exports["classification"], "assets", "vocab.txt"), encoding="utf-8") as f:
        assert f.read() == open(vocab_file, encoding="utf-8").read()


def _spec(shape, dtype, name):
    return tf.TensorSpec(shape, dtype, name=name)


# serving_default of the sentence exports as the exporter wrote it when it padded to
# max_seq_length: padding to the longest row must not change it (`truncated` came after).
TRUNCATED = {"truncated": _spec([None], tf.bool, "truncated")}
SENTENCE_SPECS = {
    "classification": ({"text": _spec([None], tf.string, "text")},
                       {"label": _spec([None], tf.string, "label"),
                        "probabilities": _spec([None, 2], tf.float32, "probabilities"), **TRUNCATED}),
    "pair": ({"text": _spec([None], tf.string, "text"), "text_pair": _spec([None], tf.string, "text_pair")},
             {"label": _spec([None], tf.string, "label"),
              "probabilities": _spec([None, 2], tf.float32, "probabilities"), **TRUNCATED}),
    "regression": ({"text": _spec([None], tf.string, "text"), "text_pair": _spec([None], tf.string, "text_pair")},
                   {"score": _spec([None], tf.float32, "score"), **TRUNCATED}),  # STS-B: a pair task
}


@pytest.mark.parametrize("name", sorted(SENTENCE_SPECS))
def test_sentence_signature_specs(exports, name):
    import tensorflow_text  # noqa: F401

    fn = tf.saved_model.load(exports[name]).signatures["serving_default"]
    inputs, outputs = SENTENCE_SPECS[name]
    assert fn.structured_input_signature == ((), inputs)
    assert fn.structured_outputs == outputs


def _ids_inputs(seq=None):
    return {k: ([None, seq], "int32") for k in INPUT_KEYS}


# Every export's two signatures: input and output names, shapes and dtypes. Read from the exports
# the exporter wrote before the task families took over the signatures (one `_signatures`
# function branching on the head's kind); multiple choice and `truncated` are new.
SIGNATURES = {
    "classification": {
        "serving_default": ({"text": ([None], "string")},
                            {"label": ([None], "string"), "probabilities": ([None, 2], "float32"),
                             "truncated": ([None], "bool")}),
        "serve_ids": (_ids_inputs(), {"logits": ([None, 2], "float32")})},
    "pair": {
        "serving_default": ({"text": ([None], "string"), "text_pair": ([None], "string")},
                            {"label": ([None], "string"), "probabilities": ([None, 2], "float32"),
                             "truncated": ([None], "bool")}),
        "serve_ids": (_ids_inputs(), {"logits": ([None, 2], "float32")})},
    "regression": {
        "serving_default": ({"text": ([None], "string"), "text_pair": ([None], "string")},
                            {"score": ([None], "float32"), "truncated": ([None], "bool")}),
        "serve_ids": (_ids_inputs(), {"predictions": ([None], "float32")})},
    "tagging": {
        "serving_default": ({"text": ([None], "string")},
                            {"labels": ([None, None], "string"), "num_words": ([None], "int32"),
                             "truncated": ([None], "bool")}),
        "serve_ids": (_ids_inputs(), {"logits": ([None, None, 3], "float32")})},
    "qa": {
        "serving_default": ({"question": ([None], "string"), "context": ([None], "string")},
                            {"answer": ([None], "string"), "start": ([None], "int32"), "end": ([None], "int32"),
                             "score": ([None], "float32"), "no_answer_score": ([None], "float32")}),
        "serve_ids": (_ids_inputs(QA_SEQ),
                      {"start_logits": ([None, QA_SEQ], "float32"), "start_top_index": ([None, 6], "int32"),
                       "end_logits": ([None, 6, QA_SEQ], "float32"), "answerable_logits": ([None], "float32")})},
    "multiple_choice": {
        "serving_default": ({"context": ([None], "string"), "choices": ([None, None], "string")},
                            {"probabilities": ([None, None], "float32"), "choice": ([None], "int32"),
                             "answer": ([None], "string")}),
        "serve_ids": ({k: ([None, None, None], "int32") for k in INPUT_KEYS},
                      {"logits": ([None, None], "float32")})},
}


@pytest.mark.parametrize("name", NAMES)
def test_signature_structure_of_every_family(exports, name):
    """Names, shapes and dtypes of both signatures, as loaded by TensorFlow (a tensor's name is
    its key)."""
    import tensorflow_text  # noqa: F401

    def described(specs):
        assert all(spec.name == key for key, spec in specs.items())
        return {key: (spec.shape.as_list(), spec.dtype.name) for key, spec in specs.items()}

    loaded = tf.saved_model.load(exports[name])
    # TF Serving's Classify / Regress signature where the family has one (test_classify_regress.py)
    extra = {"classification": {"classify"}, "pair": {"classify"}, "regression": {"regress"}}
    assert set(loaded.signatures.keys()) == {"serving_default", "serve_ids"} | extra.get(name, set())
    for signature, (inputs, outputs) in SIGNATURES[name].items():
        fn = loaded.signatures[signature]
        args, kwargs = fn.structured_input_signature
        assert args == () and described(kwargs) == inputs, signature
        assert described(fn.structured_outputs) == outputs, signature


def test_a_version_1_head_config_exports_as_before(finetuned, tmp_path):
    """`head_config.json` of version 1 ("kind", no lower_case, no text_pair) of a predefined pair
    task: exported uncased, with `text_pair` (the task's), the same signatures."""
    import shutil

    shutil.copytree(finetuned / "pair", tmp_path / "pair")
    path = tmp_path / "pair" / "best" / "head_config.json"
    values = json.loads(path.read_text())
    values.update(kind=values.pop("family"), version=1)
    del values["lower_case"], values["text_pair"]
    path.write_text(json.dumps(values))
    export = E.export_finetuned(str(tmp_path / "pair"), str(tmp_path / "export"), "old", verbose=False)
    report = json.load(open(os.path.join(export, E.EXPORT_REPORT)))
    assert (report["family"], report["task"], report["lower_case"], report["text_pair"]) == (
        "classification", "mrpc", True, True)
    assert report["signatures"]["serving_default"]["inputs"] == {"text": "string[?]", "text_pair": "string[?]"}


def _padded_widths(export_path):
    """The widths `serving_default`'s text packing pads to (-1: the longest row): the constant
    shapes given to RaggedTensorToTensor in the serve_text function of the SavedModel."""
    from tensorflow.python.framework import tensor_util

    widths = set()
    for meta_graph in E._read_saved_model(export_path).meta_graphs:
        for function in meta_graph.graph_def.library.function:
            if "serve_text" not in function.signature.name:
                continue
            consts = {n.name: n for n in function.node_def if n.op == "Const"}
            for node in function.node_def:
                shape = consts.get(node.input[0].split(":")[0]) if node.op == "RaggedTensorToTensor" else None
                if shape is not None:  # a scalar -1: no shape given, the longest row too
                    widths.add(int(tensor_util.MakeNdarray(shape.attr["value"].tensor).reshape(-1)[-1]))
    return widths


def test_sentence_exports_pad_to_the_longest_row(exports):
    """What the served answers cannot show: the sentence signatures pad to the batch's longest
    row, while tagging and QA keep max_seq_length (their outputs are laid out on it)."""
    for name in ("classification", "pair", "regression", "multiple_choice"):
        assert _padded_widths(exports[name]) == {-1}, name
    assert SEQ in _padded_widths(exports["tagging"])
    assert QA_SEQ in _padded_widths(exports["qa"])


def test_custom_op_report_lists_the_tf_text_ops_in_the_graph(exports, fresh_process):
    text_ops = set(fresh_process["text_ops"])
    assert set(E.TF_TEXT_OP_INTRODUCED) >= text_ops, "every op TF Text registers has a release"
    for name, path in exports.items():
        report = json.load(open(os.path.join(path, E.EXPORT_REPORT)))
        in_graph = E.saved_model_ops(path) & text_ops
        assert {o["op"] for o in report["custom_ops"]} == in_graph, name
        assert in_graph == {"FastWordpieceTokenizeWithOffsets", "NormalizeUTF8"}, name
        assert report["unknown_ops"] == []
        assert (report["oldest_tf_serving"], report["oldest_tf_serving_tf_text"]) == ("2.11", "2.8.2")
        assert report["version"] == int(os.path.basename(path))


def test_custom_op_report_versions():
    assert E.custom_op_report({"Const", "MatMul"})["oldest_tf_serving"] == "2.11"
    report = E.custom_op_report({"Const", "FastBertNormalize", "NormalizeUTF8"})
    assert (report["needs_tf_text"], report["oldest_tf_serving"]) == ("2.9.0", "2.12.0")
    assert E.custom_op_report({"TFText>RoundRobinTrim"})["oldest_tf_serving"] == "2.12.0"
    assert E.custom_op_report({"TFText>Utf8Binarize"})["oldest_tf_serving"] == "2.20.0"
    unknown = E.custom_op_report({"Const", "MyCustomOp"})
    assert unknown["unknown_ops"] == ["MyCustomOp"] and unknown["oldest_tf_serving"] is None


def test_ids_only_export_has_no_tf_text_ops(cases, vocab_file, export_base):
    case = cases["classification"]
    info = {"kind": "classification", "max_seq_length": SEQ, "label_names": ["negative", "positive"]}
    path = E.export_head(case.head, info, vocab_file, export_base, "ids_only", ids_only=True, verbose=False)
    report = json.load(open(os.path.join(path, E.EXPORT_REPORT)))
    assert report["custom_ops"] == [] and report["unknown_ops"] == []
    assert not E.saved_model_ops(path) & set(E.TF_TEXT_OP_INTRODUCED)
    assert set(report["signatures"]) == {"serving_default", "serve_ids"}
    assert report["signatures"]["serving_default"] == report["signatures"]["serve_ids"]
    assert os.path.exists(os.path.join(path, "assets", "vocab.txt"))
    logits = tf.saved_model.load(path).signatures["serving_default"](**_inputs(case.ids))["logits"]
    np.testing.assert_allclose(logits, case.keras["logits"], atol=2e-4)


def test_weights_are_frozen_into_the_graph_unless_asked_or_too_large(cases, exports, vocab_file,
                                                                    export_base, monkeypatch):
    """A default export holds the head's weights as constants of its one frozen function
    (`signatures.FrozenHead`) and no variable; `freeze=False`, or a head over
    `FREEZE_LIMIT_BYTES`, keeps them as variables. Both answer alike (to float rounding)."""
    import tensorflow_text  # noqa: F401

    case = cases["classification"]
    frozen_path = exports["classification"]
    assert json.load(open(os.path.join(frozen_path, E.EXPORT_REPORT)))["frozen"] is True
    frozen = tf.saved_model.load(frozen_path)
    assert len(frozen.variables) == 0
    # The weights' function is called, never inlined: a signature's call sites share one
    # instance of it (`FrozenHead`).
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(frozen_path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    library = {f.signature.name: f for f in saved.meta_graphs[0].graph_def.library.function}
    weights = max(library, key=lambda name: library[name].ByteSize())
    callers = [name for name, f in library.items()
               if any(a.func.name == weights for node in f.node_def for a in node.attr.values())]
    assert callers and all(library[name].attr["_noinline"].b for name in callers), callers
    # And few functions reach them: TensorFlow's loader copies the weights into the graph of
    # each (per signature its wrapper, its body and `by_length`'s loop body).
    calls = {name: {a.func.name for node in f.node_def for a in node.attr.values() if a.func.name}
             for name, f in library.items()}
    reaching, grew = set(callers), True
    while grew:
        more = {name for name, called in calls.items() if called & reaching} - reaching
        reaching |= more
        grew = bool(more)
    signature_count = len([k for k in saved.meta_graphs[0].signature_def if not k.startswith("__")])
    assert len(reaching) <= 1 + 3 * signature_count, sorted(reaching)
    info = {"kind": "classification", "max_seq_length": SEQ, "label_names": ["negative", "positive"]}
    kept_path = E.export_head(case.head, info, vocab_file, export_base, "kept", freeze=False,
                              verbose=False)
    monkeypatch.setattr(E, "FREEZE_LIMIT_BYTES", E.weight_bytes(case.head) - 1)
    large_path = E.export_head(case.head, info, vocab_file, export_base, "large", verbose=False)
    for path in (kept_path, large_path):
        assert json.load(open(os.path.join(path, E.EXPORT_REPORT)))["frozen"] is False
        kept = tf.saved_model.load(path)
        assert len(kept.variables) > 0
        for signature in ("serve_ids", "serving_default"):
            inputs = (_inputs(case.ids) if signature == "serve_ids"
                      else {"text": tf.constant(["a gripping , well acted film .", "dull"])})
            a = frozen.signatures[signature](**inputs)
            b = kept.signatures[signature](**inputs)
            assert set(a) == set(b)
            for key in a:
                if a[key].dtype.is_floating:
                    np.testing.assert_allclose(a[key], b[key], atol=1e-5, rtol=1e-5, err_msg=key)
                else:
                    assert a[key].numpy().tolist() == b[key].numpy().tolist(), key


# ---------------------------------------------------------------------------------------
# Versions.
# ---------------------------------------------------------------------------------------


def test_versions_next_free_and_never_overwritten(exports, export_base, cases, vocab_file):
    base = os.path.join(export_base, "classification")
    assert os.path.basename(exports["classification"]) == "1"
    info = {"kind": "classification", "max_seq_length": SEQ, "label_names": ["negative", "positive"],
            "task": "sentiment"}
    with pytest.raises(FileExistsError, match="never overwritten"):
        E.export_head(cases["classification"].head, info, vocab_file, export_base, "classification",
                      version=1, verbose=False)
    os.makedirs(os.path.join(base, "7"))  # an empty, foreign folder also counts as taken
    os.makedirs(os.path.join(base, "notes"))
    assert E.next_version(base) == 8
    path = E.export_head(cases["classification"].head, info, vocab_file, export_base, "classification",
                         verbose=False)
    assert path == os.path.join(base, "8") and os.path.exists(os.path.join(path, "saved_model.pb"))
    assert not [d for d in os.listdir(export_base) if d.startswith(".")], "staging folders removed"
    assert E.next_version(os.path.join(export_base, "missing")) == 1


def test_export_folder_gets_the_normal_mode(cases, vocab_file, export_base):
    """The version folder is staged with mkdtemp (0700) and renamed: it must end up 0777 & ~umask,
    or TF Serving under another account cannot read it."""
    import stat

    from electra_tf.files import umask

    info = {"kind": "classification", "max_seq_length": SEQ,
            "label_names": ["negative", "positive"]}
    path = E.export_head(cases["classification"].head, info, vocab_file, export_base, "modes",
                         ids_only=True, verbose=False)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o777 & ~umask()
    assert stat.S_IMODE(os.stat(os.path.join(path, "saved_model.pb")).st_mode) == 0o666 & ~umask()


def test_an_export_traces_each_signature_once(cases, vocab_file, export_base, monkeypatch):
    """Keras lists an archive's variables by tracing its endpoints, then `tf.saved_model.save`
    traces them again unless the first trace was made in a save context (`export._write_out`):
    each signature's Python body runs once per export, frozen or with variables."""
    import functools

    from electra_tf import signatures

    traced = []
    made = signatures.for_head

    def counted(*args, **kwargs):
        def count(name, fn):
            @functools.wraps(fn)  # the same argument names, so the same signature
            def body(*a, **k):
                traced.append(name)
                return fn(*a, **k)
            return body
        return {name: (count(name, fn), spec) for name, (fn, spec) in made(*args, **kwargs).items()}

    monkeypatch.setattr(signatures, "for_head", counted)
    info = {"kind": "classification", "max_seq_length": SEQ, "label_names": ["negative", "positive"]}
    for freeze in (True, False):
        traced.clear()
        path = E.export_head(cases["classification"].head, info, vocab_file, export_base,
                             f"traced_{freeze}", freeze=freeze, verbose=False)
        assert sorted(traced) == ["classify", "serve_ids", "serving_default"], (freeze, traced)
        report = json.load(open(os.path.join(path, E.EXPORT_REPORT)))
        assert report["frozen"] is freeze
        assert set(report["signatures"]) == {"classify", "serve_ids", "serving_default"}


@pytest.mark.parametrize("name", ["../x", "/tmp/abs", "a/b", "..", ".", "", ".hidden", "a\\b", "a b"])
def test_model_name_must_be_one_folder_name(cases, vocab_file, tmp_path, name):
    """A name with a '/' (or '..') would put the export outside export_base: refused before any work."""
    base = tmp_path / "export"
    info = {"kind": "classification", "max_seq_length": SEQ, "label_names": ["negative", "positive"]}
    with pytest.raises(ValueError, match=r"^model_name .* is not a folder name"):
        E.export_head(cases["classification"].head, info, vocab_file, str(base), name, ids_only=True, verbose=False)
    assert os.listdir(tmp_path) == []


def _full_disk(kind):
    """ExportArchive.write_out that writes part of the SavedModel, then fails as a full disk does."""
    def write_out(self, filepath, **kwargs):
        os.makedirs(os.path.join(filepath, "variables"))
        with open(os.path.join(filepath, "variables", "variables.data-00000-of-00001"), "wb") as f:
            f.write(b"\0" * 1000)
        if kind == "OSError":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(filepath, "variables"))
        raise tf.errors.ResourceExhaustedError(None, None, f"{filepath}/saved_model.pb; No space left on device")
    return write_out


@pytest.mark.parametrize("kind", ["OSError", "ResourceExhaustedError"])
def test_a_full_disk_leaves_nothing_behind(cases, vocab_file, tmp_path, monkeypatch, kind):
    """Writing fails midway: one line naming BASE/NAME; the staging folder is gone, and so are the
    folders the export made (BASE/NAME, BASE); an existing version is untouched and no new one
    appears."""
    import keras

    # keras.export.ExportArchive() is an instance of the backend's subclass: patch that.
    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", _full_disk(kind))
    info = {"kind": "classification", "max_seq_length": SEQ, "label_names": ["negative", "positive"]}
    base = tmp_path / "new" / "export"  # neither exists yet
    with pytest.raises(E.ExportError) as e:
        E.export_head(cases["classification"].head, info, vocab_file, str(base), "m", ids_only=True, verbose=False)
    assert str(e.value) == (f"writing the export to {base / 'm'} failed: No space left on device; what it had "
                            "written is removed; free space (or lift the file-size limit) and run it again")
    assert os.listdir(tmp_path) == []

    kept = tmp_path / "kept"
    (kept / "m" / "1").mkdir(parents=True)
    (kept / "m" / "1" / "saved_model.pb").write_bytes(b"version 1")
    with pytest.raises(E.ExportError):
        E.export_head(cases["classification"].head, info, vocab_file, str(kept), "m", ids_only=True, verbose=False)
    assert sorted(os.listdir(kept)) == ["m"] and os.listdir(kept / "m") == ["1"]
    assert os.listdir(kept / "m" / "1") == ["saved_model.pb"]
    assert (kept / "m" / "1" / "saved_model.pb").read_bytes() == b"version 1"


@pytest.mark.slow
def test_electra_export_over_the_file_size_limit_is_one_line_and_leaves_nothing(finetuned, tmp_path):
    """The binary under RLIMIT_FSIZE (Python ignores SIGXFSZ, so a write past it fails with EFBIG):
    exit code 1, one line naming BASE/NAME, no traceback, nothing new under --export_base, the
    existing version untouched (a new NAME/ is removed too: `test_a_full_disk_leaves_nothing_behind`).
    And a --model_name outside --export_base is refused in one line."""
    import resource

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base = tmp_path / "export"
    (base / "kept" / "1").mkdir(parents=True)
    (base / "kept" / "1" / "saved_model.pb").write_bytes(b"version 1")

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    runs = {name: subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.export", f"--checkpoint={finetuned / 'classification'}",
         f"--export_base={base}", f"--model_name={name}"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=small_files, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        for name in ("kept", "../outside")}  # at once: each is mostly TensorFlow's import
    for name, run in runs.items():
        _, stderr = run.communicate(timeout=300)
        last = stderr.strip().splitlines()[-1]
        assert run.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
        if name == "../outside":
            assert last.startswith("electra-export: model_name '../outside' is not a folder name"), last
        else:
            assert last == (f"electra-export: writing the export to {base / name} failed: File too large; what it "
                            "had written is removed; free space (or lift the file-size limit) and run it again"), last
    assert sorted(os.listdir(base)) == ["kept"] and os.listdir(base / "kept") == ["1"]
    assert (base / "kept" / "1" / "saved_model.pb").read_bytes() == b"version 1"
    assert not os.path.exists(tmp_path / "outside")


@pytest.mark.slow  # two exports of the binary, one killed, ~20 s
@pytest.mark.real_process  # kill -9 at a chosen moment: the command must die with the process held
def test_kill_9_during_an_export_shows_no_version_and_the_next_export_clears_its_staging(finetuned, tmp_path):
    """Killed when its staging folder holds the whole SavedModel (just before the rename): the
    existing version is untouched, no new version is visible, and the next export removes the
    dead one's staging folder (a live export's is kept: it holds a lock on it).

    The next export also checks the binary's plain run (one export for both): --checkpoint given
    as ~/... is expanded, the output names the version written and the TF Text ops with the
    oldest TF Serving that has them; and an existing --version is refused ("never
    overwritten")."""
    import time

    from electra_tf import files

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base = tmp_path / "export"
    (base / "m" / "1").mkdir(parents=True)
    (base / "m" / "1" / "saved_model.pb").write_bytes(b"version 1")
    live = base / ".m-export-live"  # another export in progress, holding its folder
    live.mkdir()
    held = files.hold(live)

    def export(*flags):  # --checkpoint as ~/...: the binary expands it
        return subprocess.Popen(
            [sys.executable, "-m", "electra_tf.tools.export", f"--checkpoint=~/{finetuned.name}/classification",
             f"--export_base={base}", "--model_name=m", *flags], cwd=repo, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", HOME=str(finetuned.parent)))

    def staged_whole():
        return [n for n in os.listdir(base) if n.startswith(".m-export-") and n != live.name
                and (base / n / "saved_model.pb").exists() and (base / n / "variables").exists()]

    try:
        process = export()
        while process.poll() is None and not staged_whole():
            time.sleep(0.0005)
        assert process.poll() is None, process.communicate()[1][-3000:]
        process.kill()
        process.communicate(timeout=60)
        assert [v for v in os.listdir(base / "m") if (base / "m" / v / "saved_model.pb").exists()] == ["1"]
        assert (base / "m" / "1" / "saved_model.pb").read_bytes() == b"version 1"
        dead = staged_whole()
        assert dead  # what the kill left, hidden from a server watching BASE/m

        process = export()
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
        complete = sorted(v for v in os.listdir(base / "m") if (base / "m" / v / "saved_model.pb").exists())
        assert len(complete) == 2 and complete[0] == "1"
        assert not any((base / n).exists() for n in dead)
        assert live.exists()
        assert f"Exported classification model to {base / 'm' / complete[1]}" in stdout
        assert "FastWordpieceTokenizeWithOffsets (TF Text 2.7.0)" in stdout
        assert "oldest TF Serving with these TF Text ops: 2.11 (bundles TF Text 2.8.2)" in stdout
        again = export("--version=1")
        _, stderr = again.communicate(timeout=300)
        assert again.returncode != 0 and "never overwritten" in stderr
    finally:
        os.close(held)


# ---------------------------------------------------------------------------------------
# End to end: export -> ModelServer over real sockets.
# ---------------------------------------------------------------------------------------


def test_served_over_rest_and_grpc_equals_in_process(exports, export_base, cases):
    from electra_tf.serving.client import GrpcClient, RestClient
    from electra_tf.serving.server import ModelServer

    case = cases["pair"]
    with ModelServer(os.path.join(export_base, "pair"), "pair", rest_port=0, grpc_port=0) as server:
        rest = RestClient("127.0.0.1", server.rest_port, "pair")
        rows = rest.predict([{"text": t, "text_pair": p} for t, p in zip(SENTENCES, PAIRS)])
        columns = rest.predict({"text": SENTENCES, "text_pair": PAIRS})
        with GrpcClient("127.0.0.1", server.grpc_port, "pair") as grpc_client:
            over_grpc = grpc_client.predict({"text": SENTENCES, "text_pair": PAIRS})
    for got in (rows, columns):
        assert [b.decode() for b in got["label"]] == case.expected["label"].tolist()
        np.testing.assert_allclose(got["probabilities"], case.expected["probabilities"], atol=2e-4)
    assert over_grpc["label"].tolist() == columns["label"].tolist()
    np.testing.assert_allclose(over_grpc["probabilities"], columns["probabilities"], atol=1e-6)


@pytest.mark.parametrize("name", ["classification", "pair", "regression"])
def test_served_sentences_padded_to_the_longest_row_equal_keras(exports, cases, tokenizer, name):
    """The sentence signatures pad a batch to its longest row, not to max_seq_length: a batch of
    short texts (padded to < SEQ) and the same texts with a long one among them (padded to SEQ)
    get, over REST, the Keras head's answers on the SEQ-padded features, to 1e-5."""
    from electra_tf.serving.client import RestClient
    from electra_tf.serving.model_config import ModelConfig
    from electra_tf.serving.server import ModelServer

    case = cases[name]
    pair = "text_pair" in case.text_inputs
    short = {"text": SENTENCES[:3], **({"text_pair": PAIRS[:3]} if pair else {})}
    mixed = {k: v[:2] + [LONG] + v[2:] for k, v in short.items()}  # the long row in the middle
    version = int(os.path.basename(exports[name]))
    config = ModelConfig(name, os.path.dirname(exports[name]), version_policy="specific", versions=(version,))
    with ModelServer(models=[config], rest_port=0, grpc_port=None) as server:
        rest = RestClient("127.0.0.1", server.rest_port, name)
        served = [rest.predict(inputs) for inputs in (short, mixed)]
    for inputs, got in zip((short, mixed), served):
        examples = [SentenceExample(i, t, inputs["text_pair"][i] if pair else None, 0)
                    for i, t in enumerate(inputs["text"])]
        keras_outputs = _numpy(case.head(_inputs(F.featurize_sentences(examples, tokenizer, SEQ)), training=False))
        want = _sentence_outputs(case.head, keras_outputs, case.label_names, _truncated(examples, tokenizer, SEQ))
        assert set(got) == set(want)
        assert got["truncated"].tolist() == [t == LONG for t in inputs["text"]]
        for key, value in want.items():
            if value.dtype == bool:
                assert got[key].tolist() == value.tolist(), key
            elif value.dtype == object:
                assert [b.decode() for b in got[key]] == value.tolist(), key
            else:
                np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5, err_msg=key)


# ---------------------------------------------------------------------------------------
# Casing: a cased vocabulary's export keeps "Apple" and "apple" apart; an uncased one folds them.
# ---------------------------------------------------------------------------------------


CASED_TEXT = ["Apple sells the apple pie .", "An apple a day , said Apple .",
              "The Apple store sold apple juice .", "I like apple and Apple likes me ."] * 20


@pytest.fixture(scope="module")
def casing_exports(tmp_path_factory):
    """{"cased", "uncased"}: a head fine-tuned with lower_case false / true over a vocabulary
    learned from cased text, exported; its report, the ids of "Apple pie" / "apple pie" and the
    fresh process's request (the file's one, `fresh_process`)."""
    from electra_tf.data.tokenizer import learn_vocab, write_vocab

    tmp_path = tmp_path_factory.mktemp("casing")
    vocab = str(tmp_path / "vocab.txt")
    write_vocab(learn_vocab(CASED_TEXT, 200, lower_case=False), vocab)
    config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab)
    out = {}
    for lower_case in (False, True):
        name = "uncased" if lower_case else "cased"
        # A seeded encoder: an unseeded one can map "Apple" and "apple" to answers closer than
        # the check below allows (it did, about once in a few runs).
        tf.keras.utils.set_random_seed(7)
        head = SentenceClassifier(config, num_labels=2)
        _amplify(head, 7)
        task = Task("company", "classification", ("fruit", "firm"))
        model = describe_finetuned(head, task, FinetuningConfig(max_seq_length=SEQ), lower_case=lower_case)
        save_finetuned(head, tmp_path / name / "best", model, vocab)
        path = E.export_finetuned(str(tmp_path / name), str(tmp_path / "export"), name, verbose=False)
        ids = F.featurize_sentences([SentenceExample(i, t) for i, t in enumerate(CASING_TEXTS)],
                                    WordpieceTokenizer(vocab, lower_case=lower_case), SEQ)
        out[name] = {"lower_case": lower_case, "ids": ids,
                     "report": json.load(open(os.path.join(path, E.EXPORT_REPORT))),
                     "request": {f"casing_{name}": {"path": path, "signatures": {
                         "serving_default": {"text": CASING_TEXTS},
                         "serve_ids": {k: ids[k].tolist() for k in INPUT_KEYS}}}}}
    return out


CASING_TEXTS = ["Apple pie", "apple pie"]


def test_export_follows_the_vocabularys_casing(casing_exports, fresh_process):
    """Heads fine-tuned with lower_case false / true over a vocabulary learned from cased text,
    exported and loaded in a process with only tensorflow + tensorflow_text: the text signature
    of the cased export answers "Apple pie" as serve_ids answers the cased ids (not those of
    "apple pie"); the uncased export answers both texts alike."""
    for name, export in casing_exports.items():
        assert export["report"]["lower_case"] is export["lower_case"]
        ids = export["ids"]["input_ids"]
        assert (ids[0] != ids[1]).any() != export["lower_case"]
    served = {name: fresh_process["models"][f"casing_{name}"] for name in ("cased", "uncased")}
    for name in ("cased", "uncased"):
        from_text = np.array(served[name]["serving_default"]["probabilities"])
        from_ids = np.array(served[name]["serve_ids"]["logits"])
        from_ids = np.exp(from_ids) / np.exp(from_ids).sum(-1, keepdims=True)
        np.testing.assert_allclose(from_text, from_ids, atol=1e-5, err_msg=name)
    # Log-probabilities: the amplified heads saturate the softmax.
    cased = np.log(served["cased"]["serving_default"]["probabilities"])
    assert np.abs(cased[0] - cased[1]).max() > 1e-2  # "Apple" and "apple": other ids, other answers
    uncased = np.log(served["uncased"]["serving_default"]["probabilities"])
    np.testing.assert_allclose(uncased[0], uncased[1], atol=1e-5)


# ---------------------------------------------------------------------------------------
# What a served export tells a client: texts it cut, token ids it refuses.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(exports):
    """One ModelServer over the classification, pair and tagging exports (REST and gRPC)."""
    from electra_tf.serving.model_config import ModelConfig
    from electra_tf.serving.server import ModelServer

    configs = [ModelConfig(name, os.path.dirname(exports[name])) for name in ("classification", "pair", "tagging")]
    with ModelServer(models=configs, rest_port=0, grpc_port=0) as server:
        yield server


def test_a_100_kb_text_is_served_as_truncated(served):
    """A text far past max_seq_length is cut to its first pieces, and the answer says so."""
    from electra_tf.serving.client import RestClient

    long_text = "the actor plays a very good story , " * 2800  # 100 KB
    assert len(long_text) > 100_000

    def predict(name, inputs):
        return RestClient("127.0.0.1", served.rest_port, name).predict(inputs)

    got = predict("classification", {"text": ["a good film", long_text]})
    assert got["truncated"].tolist() == [False, True] and np.isfinite(got["probabilities"]).all()
    got = predict("pair", {"text": ["a good film", "a good film"], "text_pair": ["it is bad", long_text]})
    assert got["truncated"].tolist() == [False, True]
    got = predict("tagging", {"text": ["a good film", long_text]})
    assert got["truncated"].tolist() == [False, True] and got["num_words"].tolist() == [3, SEQ - 2]


def test_serve_ids_refuses_ids_out_of_range(served, cases):
    """A token id that is negative or past the vocabulary (and a segment id or mask value out of
    range, inputs of different shapes, no position) gets 400 / INVALID_ARGUMENT naming the input,
    instead of an answer for some other input or an error from deep in the encoder."""
    import grpc

    from electra_tf.serving.client import GrpcClient, RestClient, ServingRequestError

    vocab_size = cases["classification"].head.config.vocab_size
    good = {"input_ids": [[2, 40, 3]], "input_mask": [[1, 1, 1]], "segment_ids": [[0, 0, 0]]}
    bad = [({"input_ids": [[2, -1, 3]]}, f"input_ids must be in [0, {vocab_size}); got values from] [-1] [to] [3]"),
           ({"input_ids": [[2, vocab_size, 3]]}, f"input_ids must be in [0, {vocab_size})"),
           ({"segment_ids": [[0, 2, 0]]}, "segment_ids must be in [0, 2)"),
           ({"input_mask": [[1, 3, 1]]}, "input_mask must be in [0, 2)"),
           # Inputs of different shapes: a narrower mask used to cut the ids to its width and
           # a one-row mask to broadcast over the rows, each answering for other inputs.
           ({"input_mask": [[1, 1]]}, "input_mask must have the shape of input_ids; got] [1 2] [and] [1 3]"),
           ({"input_mask": [[1, 1, 1, 1]]}, "input_mask must have the shape of input_ids"),
           ({"segment_ids": [[0, 0]]}, "segment_ids must have the shape of input_ids"),
           ({"input_ids": [[2, 40, 3], [2, 41, 3]]}, "input_mask must have the shape of input_ids; got] [1 3] [and] [2 3]"),
           ({k: [[]] for k in good}, "input_ids must have 1 to ")]
    rest = RestClient("127.0.0.1", served.rest_port, "classification")
    assert rest.predict(good, signature_name="serve_ids")["logits"].shape == (1, 2)
    with GrpcClient("127.0.0.1", served.grpc_port, "classification") as grpc_client:
        for changes, words in bad:
            inputs = {**good, **changes}
            with pytest.raises(ServingRequestError) as e:
                rest.predict(inputs, signature_name="serve_ids")
            assert e.value.status == 400 and words in e.value.message and "\n" not in e.value.message, e.value.message
            assert e.value.message.startswith("running signature 'serve_ids' failed: assertion failed: [")
            with pytest.raises(ServingRequestError) as e:
                grpc_client.predict({k: np.array(v, np.int32) for k, v in inputs.items()}, signature_name="serve_ids")
            assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.message


# ---------------------------------------------------------------------------------------
# Warmup: the export's requests (TF Serving's format), replayed before AVAILABLE.
# ---------------------------------------------------------------------------------------


def _warmup_calls(log) -> tuple[str, int]:
    """(signature, batch size) of a warmup PredictionLog."""
    kind = log.WhichOneof("log_type")
    request = getattr(log, kind).request
    if kind == "predict_log":
        return request.model_spec.signature_name, tf.make_ndarray(next(iter(request.inputs.values()))).shape[0]
    return request.model_spec.signature_name, len(request.input.example_list.examples)


def test_every_export_ships_warmup_requests_that_run(exports, vocab_file):
    """Each export's assets.extra/tf_serving_warmup_requests parses as TF Serving's PredictionLogs
    (at most 1,000), names the model, covers every signature at batch sizes 1 and 8, has a text
    longer than max_seq_length, and runs through the local server's replay without an error."""
    from tensorflow_serving.apis import prediction_log_pb2

    from electra_tf import warmup as W
    from electra_tf.serving import warmup as replayer
    from electra_tf.serving.servables import Servable

    for name, path in exports.items():
        logs = []
        for record in tf.data.TFRecordDataset(os.path.join(path, W.WARMUP_FILE)).as_numpy_iterator():
            logs.append(prediction_log_pb2.PredictionLog.FromString(record))
        assert 0 < len(logs) <= 1000
        servable = Servable(name, 1, path)
        assert {_warmup_calls(log) for log in logs} == {
            (s, b) for s in servable.signatures for b in W.BATCH_SIZES}, name
        assert all(getattr(log, log.WhichOneof("log_type")).request.model_spec.name == name for log in logs)
        first = {}  # each signature's first request: one sentence (the weight layouts, W's doc)
        for log in logs:
            first.setdefault(*_warmup_calls(log))
        assert set(first.values()) == {1}, (name, first)
        report = json.loads(open(os.path.join(path, E.EXPORT_REPORT)).read())
        assert report["warmup_requests"] == len(logs)
        texts = [t for log in logs if log.predict_log.request.model_spec.signature_name == "serving_default"
                 for v in log.predict_log.request.inputs.values() for t in tf.make_ndarray(v).ravel()]
        assert max(len(t.split()) for t in texts) > report["max_seq_length"], name
        assert replayer.replay(servable)[0] == len(logs)
        if name == "classification":  # batch 1 at every length the text signature pads to
            seq = report["max_seq_length"]
            pre = P.TextPreprocessor.from_vocab(vocab_file, seq)
            singles = [tf.make_ndarray(log.predict_log.request.inputs["text"]) for log in logs
                       if log.predict_log.request.model_spec.signature_name == "serving_default"]
            packed = {int(pre.pack_sentences(tf.constant(t))["input_mask"].numpy().sum())
                      for t in singles if len(t) == 1}
            assert set(range(3, seq + 1)) <= packed, sorted(packed)


def test_a_failing_warmup_request_fails_the_load(exports, tmp_path):
    """As TF Serving: a warmup record that is not a PredictionLog, or whose request fails, fails
    the version's load with one line naming the record; the version is never AVAILABLE."""
    import shutil

    from tensorflow_serving.apis import prediction_log_pb2

    from electra_tf import warmup as W
    from electra_tf.serving.manager import ModelManager
    from electra_tf.serving.model_config import ModelConfig

    wrong = prediction_log_pb2.PredictionLog()
    wrong.predict_log.request.model_spec.signature_name = "no_such_signature"
    wrong.predict_log.request.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([b"a film"], object)))
    for version, record, words in ((1, b"\xff\xff not a proto", "record 0 is not a PredictionLog"),
                                   (2, wrong.SerializeToString(), 'record 0 failed: Serving signature key "no_such_signature" not found')):
        folder = tmp_path / "m" / str(version)
        shutil.copytree(exports["classification"], folder)
        with tf.io.TFRecordWriter(str(folder / W.WARMUP_FILE)) as writer:
            writer.write(record)
    manager = ModelManager([ModelConfig("m", str(tmp_path / "m"), version_policy="all")])
    manager.poll()
    statuses = {s.version: s for s in manager.status("m", None).model_version_status}
    for version, words in ((1, "record 0 is not a PredictionLog"),
                           (2, 'record 0 failed: Serving signature key "no_such_signature" not found')):
        message = statuses[version].status.error_message
        assert statuses[version].state != statuses[version].AVAILABLE and words in message, message
        assert "\n" not in message


def test_warmup_runs_each_record_as_often_as_asked_or_not_at_all(exports, tmp_path, iterated_datasets):
    """TF Serving's --num_request_iterations_for_warmup (each record run N times in a row) and
    --enable_model_warmup=false (none run: a version whose warmup file fails loads anyway). The
    file is read without tf.data's autotuner (an autotuned iterator's end waits for its wake-up)."""
    import shutil

    from electra_tf import warmup as W
    from electra_tf.serving import warmup as replayer
    from electra_tf.serving.manager import ModelManager
    from electra_tf.serving.model_config import ModelConfig
    from electra_tf.serving.servables import Servable

    folder = tmp_path / "m" / "1"
    shutil.copytree(exports["classification"], folder)
    records = list(tf.data.TFRecordDataset(str(folder / W.WARMUP_FILE)).take(2).as_numpy_iterator())
    with tf.io.TFRecordWriter(str(folder / W.WARMUP_FILE)) as writer:
        for record in records:
            writer.write(record)
    runs = []
    del iterated_datasets[:]  # the replays' own below

    class Counted(Servable):  # the real signatures, each call counted
        def signature(self, name):
            signature = super().signature(name)
            if not hasattr(signature, "uncounted"):
                signature.uncounted = signature.run
                signature.run = lambda *a, **k: (runs.append(name), signature.uncounted(*a, **k))[1]
            return signature

    assert replayer.replay(Counted("m", 1, str(folder)), 3)[0] == 6 and len(runs) == 6
    assert replayer.replay(Counted("m", 1, str(folder)), 0)[0] == 2 and len(runs) == 8  # < 1 is once
    assert len(iterated_datasets) == 2
    assert all(d.options().autotune.enabled is False for d in iterated_datasets)

    with tf.io.TFRecordWriter(str(folder / W.WARMUP_FILE)) as writer:
        writer.write(b"\xff\xff not a proto")
    for iterations, state in ((1, "END"), (0, "AVAILABLE")):
        manager = ModelManager([ModelConfig("m", str(tmp_path / "m"))], warmup_iterations=iterations)
        manager.poll()
        status = manager.status("m", None).model_version_status[0]
        assert status.State.Name(status.state) == state, (iterations, status)


def test_an_unloaded_or_failed_version_is_freed_at_once(exports, tmp_path, monkeypatch):
    """A loaded SavedModel's objects hold each other in cycles: a version the server drops (a newer
    one replaced it, or its warmup failed) must be collected when it is dropped, not whenever
    Python's collector next runs a full pass (an ELECTRA-Small server grew from 2.5 to 5.6 GB over
    four version changes). Automatic collection is off here, so only the server's own frees it."""
    import gc
    import shutil
    import weakref

    from electra_tf import warmup as W
    from electra_tf.serving import manager as M

    loaded = {}

    class Recorded(M.Servable):
        def __init__(self, name, version, path, **options):
            super().__init__(name, version, path, **options)
            # The signature's graph: the loaded root goes by reference counting, its graphs only
            # with a collection (~35,000 objects for ELECTRA-Small).
            loaded[version] = weakref.ref(self._loaded.signatures["serving_default"].graph)

    monkeypatch.setattr(M, "Servable", Recorded)
    base = tmp_path / "m"
    shutil.copytree(exports["classification"], base / "1")
    manager = M.ModelManager([M.ModelConfig("m", str(base))])
    gc.collect()
    gc.disable()
    try:
        manager.poll()
        assert loaded[1]() is not None  # serving
        shutil.copytree(exports["classification"], base / "2")
        manager.poll()  # version 2 loads, version 1 is unloaded
        assert loaded[2]() is not None and loaded[1]() is None
        shutil.copytree(exports["classification"], base / "3")
        with tf.io.TFRecordWriter(str(base / "3" / W.WARMUP_FILE)) as writer:
            writer.write(b"\xff\xff not a proto")
        manager.poll()  # version 3 loads, its warmup fails: dropped, version 2 keeps serving
        statuses = {s.version: s for s in manager.status("m", None).model_version_status}
        assert statuses[3].state != statuses[3].AVAILABLE and statuses[2].state == statuses[2].AVAILABLE
        assert loaded[3]() is None and loaded[2]() is not None
    finally:
        gc.enable()


@pytest.mark.slow
def test_the_first_request_to_a_new_version_is_warm(exports, tmp_path):
    """electra-serve replays the warmup file before AVAILABLE, so the first request after a load
    is within 2x the steady-state median; the same version without the file is far above it
    (the signature graph's first call), which is what the file is for."""
    import shutil
    import socket
    import time
    import urllib.error
    import urllib.request

    from electra_tf import warmup as W
    from tests.server_process import serving

    body = json.dumps({"instances": [{"text": "a moving and often funny film"}]}).encode()

    def first_and_median(base) -> tuple[float, float]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1/models/m"
        command = [sys.executable, "-m", "electra_tf.tools.serve", f"--rest_api_port={port}",
                   "--port=0", f"--model_base_path={base}", "--model_name=m",
                   "--file_system_poll_wait_seconds=0"]
        times = []
        with serving(command, url, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")):
            # The REST path's own first use (connection, parsing, answering: ~2 ms, measured)
            # is the server's, not the version's: a refused request takes it first.
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(
                    url + ":predict", data=b'{"instances": [{"txt": "x"}]}'), timeout=60)
            assert refused.value.code == 400
            for _ in range(21):
                start = time.perf_counter()
                urllib.request.urlopen(urllib.request.Request(url + ":predict", data=body), timeout=60).read()
                times.append(time.perf_counter() - start)
        return times[0], float(np.median(times[1:]))

    warm, cold = tmp_path / "warm", tmp_path / "cold"
    shutil.copytree(exports["classification"], warm / "1")
    shutil.copytree(exports["classification"], cold / "1")
    os.remove(cold / "1" / W.WARMUP_FILE)
    # Without warmup the first request pays TensorFlow's first call (0.1-0.9 s against a ~2 ms
    # median); with it, only what another process on the cores adds to one request (a few ms).
    first, median = first_and_median(warm)
    assert first <= max(3 * median, median + 0.02), (first, median)
    first, median = first_and_median(cold)
    assert first > max(10 * median, median + 0.05), (first, median)



# The fresh process of the test below: the export's warmup replayed as the server replays it,
# then one-sentence requests, with oneDNN reporting every primitive it runs (stdout).
_RELAYOUT_PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    from electra_tf.serving import warmup
    from electra_tf.serving.servables import Servable

    servable = Servable("m", 1, sys.argv[1])
    warmup.replay(servable)
    text = {"text": np.array([" ".join(["the movie was great"] * 3).encode()], object)}  # 12 pieces
    length = int(sys.argv[2])  # the fine-tuning features' layout: padded to max_seq_length (the
    # signature runs the rows' real length, as serving_default does)
    ids = {"input_ids": np.zeros((1, length), np.int32), "input_mask": np.zeros((1, length), np.int32),
           "segment_ids": np.zeros((1, length), np.int32)}
    ids["input_ids"][0, :14], ids["input_mask"][0, :14] = np.arange(1, 15), 1
    for name, inputs in (("serving_default", text), ("serve_ids", ids)):
        signature = servable.signature(name)
        signature.call(inputs)
        print("=== requests", name, flush=True)
        for _ in range(3):
            signature.call(inputs)
        print("=== end", flush=True)
""")


def test_after_warmup_a_one_sentence_request_lays_out_no_weights_again(vocab_file, tmp_path):
    """TensorFlow's oneDNN matmuls keep a constant weight in the blocked layout that the kernel's
    FIRST call picks, and that layout depends on the call's row count (for these shapes one for
    ~8-80 rows, another below and above): every later call whose shape picks the other lays the
    weight out again, on every call (~3 ms of an ELECTRA-Small request). So each signature's first
    warmup request is one typical sentence, what an online service sends most; when the first was
    a 4-word sentence, every one-sentence request after the warmup re-laid out the attention's
    weights. The same for `serve_ids` fed the fine-tuning features (padded ids). Counted with
    ONEDNN_VERBOSE in a fresh process, on a classifier whose biases and
    normalisation are off 0 and 1 as a fine-tuned one's (zero biases are folded away, and with
    them the fused bias matmuls that keep weights). Where TensorFlow runs no oneDNN kernels
    (nothing reported) there is nothing to check."""
    from benchmarks.serving_bench_model import like_trained

    config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file)
    head = SentenceClassifier(config, num_labels=2)
    assert like_trained(head.weights) > 0
    # 128, more positions than the test vocabulary has ids: the warmup's ids stay below its size.
    length = config.max_position_embeddings
    info = {"task": "sentiment", "label_names": ["negative", "positive"], "max_seq_length": length,
            "lower_case": True}
    path = E.export_head(head, info, vocab_file, str(tmp_path), "m", verbose=False)
    result = subprocess.run([sys.executable, "-c", _RELAYOUT_PROBE, path, str(length)],
                            env=dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="2"),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for part in result.stdout.split("=== requests ")[1:]:
        name, lines = part.split("=== end")[0].split("\n", 1)
        executed = [line for line in lines.splitlines() if ",exec," in line]
        if not executed:
            pytest.skip("TensorFlow ran no oneDNN primitive on this CPU")
        assert any(",inner_product," in line for line in executed), (name, executed[:5])
        relayouts = [line for line in executed if ",reorder," in line]
        assert not relayouts, f"{name}: {len(relayouts)} weight re-layouts in 3 requests, e.g. {relayouts[0]}"
