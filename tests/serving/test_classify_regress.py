"""TF Serving's Classify and Regress APIs: the `classify` / `regress` signatures the exporter writes
(electra_tf/signatures.py) and the server's REST :classify / :regress and gRPC Classify / Regress /
MultiInference (serving/inference_api.py), against serving_default on the same texts.

The exports are random-initialised tiny heads whose output layers get large weights, so that the
texts get clearly different scores. The server is `electra-serve` in its own process over
127.0.0.1 (tests/server_process.py).
"""

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    classification_pb2, inference_pb2, predict_pb2, prediction_service_pb2_grpc, regression_pb2)

from electra_tf import export as E
from electra_tf.config import ElectraConfig
from electra_tf.finetune.heads import SentenceClassifier, SentenceRegressor
from electra_tf.serving.client import GrpcClient, RestClient, ServingRequestError
from tests.server_process import serving

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ = 24
MAX_BATCH = 8
WORDS = "the a movie film great bad good is was not very it plays actor story , . !".split()
TEXTS = ["The movie was great!", "not a good film , very bad .", "", "Naïve café plays", "the actor plays it"]
PAIRS = ["it is bad", "", "great", "the film plays well", "short"]
LABELS = ("negative", "neutral", "positive")
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
PREDICT = "tensorflow/serving/predict"


# ---------------------------------------------------------------------------------------
# Exports: single-text classification with label names, pair classification without them
# (classes "0", "1"), pair regression.
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    chars = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *WORDS]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    return str(path)


def _amplified(head, seed):
    """Random weights on the head's own layers, large enough that the texts get clearly different
    scores and small enough that the softmax is not saturated."""
    rng = np.random.default_rng(seed)
    for layer in head.layers:
        if layer is not head.encoder and getattr(layer, "kernel", None) is not None:
            layer.kernel.assign(rng.normal(0.0, 0.1, layer.kernel.shape).astype("float32"))
    return head


@pytest.fixture(scope="module")
def export_base(tmp_path_factory):
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def exports(vocab_file, export_base):
    """{name: version folder}: `sentiment` (text -> 3 named labels), `paraphrase` (text, text_pair
    -> 2 unnamed labels), `similarity` (text, text_pair -> a score)."""
    tf.keras.utils.set_random_seed(3)
    config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file)
    heads = {
        "sentiment": (SentenceClassifier(config, num_labels=3), {"label_names": LABELS, "text_pair": False}),
        "paraphrase": (SentenceClassifier(config, num_labels=2), {"text_pair": True}),
        "similarity": (SentenceRegressor(config), {"text_pair": True}),
    }
    paths = {}
    for seed, (name, (head, fields)) in enumerate(heads.items()):
        paths[name] = E.export_head(_amplified(head, seed), {"max_seq_length": SEQ, "task": name, **fields},
                                    vocab_file, str(export_base), name, verbose=False)
    return paths


def _signature_defs(path):
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return saved_model.meta_graphs[0].signature_def


def _described(tensors):
    return {k: (types_pb2.DataType.Name(v.dtype), [d.size for d in v.tensor_shape.dim]) for k, v in tensors.items()}


def _example(**features):
    return tf.train.Example(features=tf.train.Features(feature={
        k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()])) for k, v in features.items()
    })).SerializeToString()


def _text_inputs(name):
    return {"text": TEXTS} if name == "sentiment" else {"text": TEXTS, "text_pair": PAIRS}


def _examples(name):
    inputs = _text_inputs(name)
    return [dict(zip(inputs, values)) for values in zip(*inputs.values())]


# ---------------------------------------------------------------------------------------
# (a) The SavedModel.
# ---------------------------------------------------------------------------------------


def test_signature_defs_have_tf_servings_method_names_dtypes_and_shapes(exports):
    want = {
        "sentiment": ("classify", {"classes": ("DT_STRING", [-1, 3]), "scores": ("DT_FLOAT", [-1, 3])}),
        "paraphrase": ("classify", {"classes": ("DT_STRING", [-1, 2]), "scores": ("DT_FLOAT", [-1, 2])}),
        "similarity": ("regress", {"outputs": ("DT_FLOAT", [-1])}),
    }
    for name, (signature, outputs) in want.items():
        defs = _signature_defs(exports[name])
        assert sorted(k for k in defs if not k.startswith("__")) == sorted(["serving_default", signature, "serve_ids"])
        assert defs[signature].method_name == (CLASSIFY if signature == "classify" else REGRESS), name
        assert defs["serving_default"].method_name == PREDICT and defs["serve_ids"].method_name == PREDICT
        assert _described(defs[signature].inputs) == {"inputs": ("DT_STRING", [-1])}, name
        assert _described(defs[signature].outputs) == outputs, name
        report = json.load(open(os.path.join(exports[name], E.EXPORT_REPORT)))
        assert list(report["signatures"][signature]["inputs"]) == ["inputs"]


def test_the_fingerprint_is_the_rewritten_saved_models(exports):
    """fingerprint.pb checksums saved_model.pb; after the method names are set it must be the
    fingerprint of the file as it now is."""
    from tensorflow.core.protobuf import fingerprint_pb2
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    path = exports["sentiment"]
    fresh = fingerprint_pb2.FingerprintDef.FromString(fingerprinting.CreateFingerprintDef(path))
    written = tf.saved_model.experimental.read_fingerprint(path)
    assert written.saved_model_checksum == fresh.saved_model_checksum
    assert written.signature_def_hash == fresh.signature_def_hash


@pytest.mark.parametrize("name", ["sentiment", "paraphrase", "similarity"])
def test_the_example_signature_equals_serving_default_in_process(exports, name):
    import tensorflow_text  # noqa: F401

    loaded = tf.saved_model.load(exports[name])
    texts = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in _text_inputs(name).items()})
    examples = tf.constant([_example(**features) for features in _examples(name)])
    if name == "similarity":
        got = loaded.signatures["regress"](inputs=examples)
        np.testing.assert_allclose(got["outputs"], texts["score"], rtol=1e-6, atol=1e-6)
        assert np.ptp(texts["score"].numpy()) > 1e-3  # the texts get different answers
        return
    got = loaded.signatures["classify"](inputs=examples)
    np.testing.assert_allclose(got["scores"], texts["probabilities"], rtol=1e-6, atol=1e-6)
    names = list(LABELS) if name == "sentiment" else ["0", "1"]
    assert got["classes"].numpy().astype(str).tolist() == [names] * len(TEXTS)
    top = [names[i] for i in got["scores"].numpy().argmax(-1)]
    assert top == texts["label"].numpy().astype(str).tolist()
    scores = got["scores"].numpy()
    assert np.abs(scores - scores[0]).max() > 1e-3  # the texts get different answers


def test_a_missing_or_mistyped_feature_is_an_invalid_argument_naming_it(exports):
    import tensorflow_text  # noqa: F401

    classify = tf.saved_model.load(exports["paraphrase"]).signatures["classify"]
    mistyped = tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
        "text_pair": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a"]))})).SerializeToString()
    for example, words in ((_example(text="a film"), "Feature: text_pair"), (mistyped, "Key: text,")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=words):
            classify(inputs=tf.constant([example]))


def test_ids_only_exports_no_example_signature(exports, vocab_file, tmp_path):
    head = SentenceClassifier(ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file), num_labels=2)
    path = E.export_head(head, {"max_seq_length": SEQ, "task": "x", "text_pair": False}, vocab_file,
                         str(tmp_path), "ids", ids_only=True, verbose=False)
    defs = _signature_defs(path)
    assert sorted(k for k in defs if not k.startswith("__")) == ["serve_ids", "serving_default"]
    assert {d.method_name for k, d in defs.items() if not k.startswith("__")} == {PREDICT}


# ---------------------------------------------------------------------------------------
# (b) A real server process: REST and gRPC, Predict and Classify / Regress agree.
# ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(exports, export_base, tmp_path_factory):
    """electra-serve over the three exports: (REST port, gRPC port)."""
    config = tmp_path_factory.mktemp("config") / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{os.path.dirname(path)}" model_platform: "tensorflow" }}\n'
        for name, path in exports.items()) + "}\n")
    rest, grpc_port = _free_port(), _free_port()
    command = [sys.executable, "-m", "electra_tf.tools.serve", f"--rest_api_port={rest}", f"--port={grpc_port}",
               f"--model_config_file={config}", "--file_system_poll_wait_seconds=0", f"--max_batch_size={MAX_BATCH}",
               "--enable_signature_method_name_check"]  # the method-name refusals below; off: test_native_tf2_*
    with serving(command, f"http://127.0.0.1:{rest}/v1/models/sentiment", cwd=REPO,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")):
        yield rest, grpc_port


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(f"127.0.0.1:{server[1]}") as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _post(server, path, body):
    """(status, JSON) of a REST POST; never raises on 4xx/5xx."""
    request = urllib.request.Request(f"http://127.0.0.1:{server[0]}{path}", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["sentiment", "paraphrase"])
def test_classify_over_rest_and_grpc_equals_predict(server, stub, name):
    """REST :predict, REST :classify, gRPC Predict, gRPC Classify and gRPC Predict on the
    classify signature give the same labels and scores."""
    rest = RestClient("127.0.0.1", server[0], name)
    with GrpcClient("127.0.0.1", server[1], name) as grpc_client:
        predicted = {"rest": rest.predict(_text_inputs(name)), "grpc": grpc_client.predict(_text_inputs(name))}
        classified = {"rest": rest.classify(_examples(name)), "grpc": grpc_client.classify(_examples(name))}
    names = list(LABELS) if name == "sentiment" else ["0", "1"]
    want = predicted["rest"]["probabilities"]
    assert np.abs(want - want[0]).max() > 1e-3  # the texts get different answers
    np.testing.assert_allclose(predicted["grpc"]["probabilities"], want, rtol=0, atol=1e-6)
    assert predicted["grpc"]["label"].tolist() == predicted["rest"]["label"].tolist()
    for api, results in classified.items():
        assert [[label for label, _ in row] for row in results] == [names] * len(TEXTS), api
        np.testing.assert_allclose([[score for _, score in row] for row in results], want, rtol=0, atol=1e-6,
                                   err_msg=api)
        top = [max(row, key=lambda c: c[1])[0].encode() for row in results]
        assert top == predicted["rest"]["label"].tolist(), api
    assert classified["grpc"] == classified["rest"]  # the same Python values from both clients

    # Predict may call the classify signature, as TF Serving lets it.
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = name, "classify"
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([_example(**e) for e in _examples(name)]))
    response = stub.Predict(request, timeout=60)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["scores"]), want, rtol=0, atol=1e-6)


@pytest.mark.multiprocess
def test_regress_over_rest_and_grpc_equals_predict(server):
    rest = RestClient("127.0.0.1", server[0], "similarity")
    want = rest.predict(_text_inputs("similarity"))["score"]
    assert np.ptp(want) > 1e-3
    with GrpcClient("127.0.0.1", server[1], "similarity") as grpc_client:
        over_grpc = grpc_client.regress(_examples("similarity"))
    over_rest = rest.regress(_examples("similarity"))
    np.testing.assert_allclose(over_rest, want, rtol=0, atol=1e-6)
    assert over_grpc == over_rest
    status, raw = _post(server, "/v1/models/similarity:regress",
                        {"signature_name": "regress", "examples": _examples("similarity")})
    assert status == 200 and set(raw) == {"results"} and len(raw["results"]) == len(TEXTS)
    assert all(isinstance(v, float) for v in raw["results"])  # {"results": [value, ...]}


@pytest.mark.multiprocess
def test_the_clients_text_call_takes_the_classify_and_regress_apis_by_the_signatures_method(server):
    """`classify_texts` (electra-client --signature_name=classify / regress) sends texts to a
    Classify or Regress signature as tf.Examples, through that API (a Predict with `text` fails
    there: its input is `inputs`), over REST and gRPC alike."""
    for name, signature in (("paraphrase", "classify"), ("similarity", "regress")):
        rest = RestClient("127.0.0.1", server[0], name)
        with GrpcClient("127.0.0.1", server[1], name) as grpc_client:
            got = {c: client.classify_texts(TEXTS, PAIRS, signature) for c, client in
                   (("rest", rest), ("grpc", grpc_client))}
        assert got["rest"] == got["grpc"] and len(got["rest"]) == len(TEXTS)
        if signature == "classify":
            want = rest.classify(_examples(name))
            assert got["rest"] == [{"classes": [c for c, _ in row], "scores": [s for _, s in row]} for row in want]
        else:
            assert got["rest"] == [{"outputs": v} for v in rest.regress(_examples(name))]


@pytest.mark.multiprocess
def test_context_features_go_into_every_example_and_the_examples_win(server):
    """`context` holds text_pair for all; an example's own text_pair replaces it."""
    rest = RestClient("127.0.0.1", server[0], "paraphrase")
    pairs = [PAIRS[0]] * 4 + [PAIRS[4]]
    want = rest.predict({"text": TEXTS, "text_pair": pairs})["probabilities"]
    examples = [{"text": t} for t in TEXTS[:4]] + [{"text": TEXTS[4], "text_pair": PAIRS[4]}]
    context = {"text_pair": PAIRS[0]}
    with GrpcClient("127.0.0.1", server[1], "paraphrase") as grpc_client:
        over_grpc = grpc_client.classify(examples, context=context)
    over_rest = rest.classify(examples, context=context)
    np.testing.assert_allclose([[s for _, s in row] for row in over_rest], want, rtol=0, atol=1e-6)
    assert over_grpc == over_rest
    status, raw = _post(server, "/v1/models/paraphrase:classify",
                        {"signature_name": "classify", "context": context, "examples": examples})
    assert status == 200 and [[c[0] for c in row] for row in raw["results"]] == [["0", "1"]] * 5  # [[[label, score]...]]


@pytest.mark.multiprocess
def test_grpc_responses_name_the_model_version_and_signature(server, stub):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name = "sentiment", "classify"
    request.input.example_list.examples.add().ParseFromString(_example(text="a good film"))
    response = stub.Classify(request, timeout=60)
    assert (response.model_spec.name, response.model_spec.version.value, response.model_spec.signature_name) == \
        ("sentiment", 1, "classify")
    assert [c.label for c in response.result.classifications[0].classes] == list(LABELS)

    multi = inference_pb2.MultiInferenceRequest()
    multi.tasks.add(method_name=CLASSIFY).model_spec.CopyFrom(request.model_spec)
    multi.input.CopyFrom(request.input)
    result = stub.MultiInference(multi, timeout=60).results[0]
    assert result.model_spec.signature_name == "classify"
    assert result.classification_result == response.result


# ---------------------------------------------------------------------------------------
# (c) Bad requests: 400 / INVALID_ARGUMENT with one line, and the server keeps serving.
# ---------------------------------------------------------------------------------------

GOOD = {"signature_name": "classify", "examples": [{"text": "a film"}]}
BAD_REST = [
    ("missing feature", "sentiment", "classify", {"signature_name": "classify", "examples": [{"txt": "a"}]},
     "Feature: text (data type: string) is required but could not be found"),
    ("wrong type", "sentiment", "classify", {"signature_name": "classify", "examples": [{"text": 3}]},
     "Key: text, Index: 0.  Data types don't match. Data type: int64 but expected type: string"),
    ("two values", "sentiment", "classify", {"signature_name": "classify", "examples": [{"text": ["a", "b"]}]},
     "Key: text"),
    ("empty examples", "sentiment", "classify", {"signature_name": "classify", "examples": []}, "'examples' is empty"),
    ("no examples", "sentiment", "classify", {"signature_name": "classify"}, "'examples' must be a list"),
    ("examples not objects", "sentiment", "classify", {"signature_name": "classify", "examples": ["a film"]},
     "examples[0]: must be an object"),
    ("a boolean", "sentiment", "classify", {"signature_name": "classify", "examples": [{"text": True}]},
     "got true/false"),
    ("a nested list", "sentiment", "classify", {"signature_name": "classify", "examples": [{"text": [["a"]]}]},
     "got a nested list"),
    ("mixed list", "sentiment", "classify", {"signature_name": "classify", "examples": [{"text": ["a", 1]}]},
     "mixes strings and numbers"),
    ("bad b64", "sentiment", "classify", {"signature_name": "classify", "examples": [{"text": {"b64": "%%"}}]},
     "not valid base64"),
    ("instances", "sentiment", "classify", {"signature_name": "classify", "instances": ["a"]}, "go to :predict"),
    ("batch too large", "sentiment", "classify", {"signature_name": "classify", "examples": [{"text": "a"}] * (MAX_BATCH + 1)},
     f"holds {MAX_BATCH + 1} examples, more than the server's max_batch_size {MAX_BATCH}"),
    ("default signature is predict", "sentiment", "classify", {"examples": [{"text": "a"}]},
     "Expected classification signature method_name to be tensorflow/serving/classify. Was: tensorflow/serving/predict"),
    ("predict signature", "sentiment", "classify", {"signature_name": "serve_ids", "examples": [{"text": "a"}]},
     "its classify signatures: 'classify'"),
    ("classify signature asked to regress", "sentiment", "regress", GOOD,
     "Expected regression signature method_name to be tensorflow/serving/regress. Was: tensorflow/serving/classify"),
    ("regress signature asked to classify", "similarity", "classify",
     {"signature_name": "regress", "examples": [{"text": "a", "text_pair": "b"}]}, "call it with :regress"),
    ("unknown signature", "sentiment", "classify", {"signature_name": "nope", "examples": [{"text": "a"}]},
     'Serving signature key "nope" not found'),
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("what,model,verb,body,words", BAD_REST, ids=[b[0] for b in BAD_REST])
def test_bad_rest_requests_get_400_with_one_line(server, what, model, verb, body, words):
    status, got = _post(server, f"/v1/models/{model}:{verb}", body)
    assert status == 400, got
    assert set(got) == {"error"} and words in got["error"], got["error"]
    assert "\n" not in got["error"] and "Traceback" not in got["error"]
    assert _post(server, "/v1/models/sentiment:classify", GOOD)[0] == 200


def _classification_request(model="sentiment", signature="classify", examples=(), context=None):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    target = request.input.example_list_with_context if context is not None else request.input.example_list
    if context is not None:
        target.context.ParseFromString(context)
    for example in examples:
        target.examples.add().ParseFromString(example)
    return request


BAD_GRPC = [
    ("missing feature", "Classify", _classification_request(examples=[_example(txt="a")]), "Feature: text"),
    ("wrong type", "Classify", _classification_request(examples=[tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))})).SerializeToString()]),
     "Data types don't match"),
    ("no input", "Classify", _classification_request(), "Input is empty"),
    ("empty examples", "Classify", _classification_request(context=_example(text="a")),
     "input.example_list_with_context.examples is empty"),
    ("batch too large", "Classify", _classification_request(examples=[_example(text="a")] * (MAX_BATCH + 1)),
     f"more than the server's max_batch_size {MAX_BATCH}"),
    ("predict signature", "Classify", _classification_request(signature="", examples=[_example(text="a")]),
     "Was: tensorflow/serving/predict"),
    ("classify signature asked to regress", "Regress", regression_pb2.RegressionRequest(
        model_spec=_classification_request().model_spec, input=_classification_request(examples=[_example(text="a")]).input),
     "Expected regression signature method_name"),
    ("duplicate task", "MultiInference", inference_pb2.MultiInferenceRequest(
        tasks=[inference_pb2.InferenceTask(model_spec=_classification_request().model_spec, method_name=CLASSIFY)] * 2,
        input=_classification_request(examples=[_example(text="a")]).input), "Duplicate evaluation of signature: classify"),
    ("predict task", "MultiInference", inference_pb2.MultiInferenceRequest(
        tasks=[inference_pb2.InferenceTask(model_spec=_classification_request().model_spec, method_name=PREDICT)],
        input=_classification_request(examples=[_example(text="a")]).input), "Unsupported signature method_name"),
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("what,method,request_message,words", BAD_GRPC, ids=[b[0] for b in BAD_GRPC])
def test_bad_grpc_requests_get_invalid_argument_with_one_line(server, stub, what, method, request_message, words):
    with pytest.raises(grpc.RpcError) as e:
        getattr(stub, method)(request_message, timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert words in e.value.details() and "\n" not in e.value.details(), e.value.details()
    assert stub.Classify(_classification_request(examples=[_example(text="a")]), timeout=60).result.classifications


@pytest.mark.multiprocess
def test_client_errors_carry_the_status(server):
    rest = RestClient("127.0.0.1", server[0], "sentiment")
    with pytest.raises(ServingRequestError) as e:
        rest.classify([{"text": "a"}], signature_name="serving_default")
    assert e.value.status == 400 and "'classify'" in e.value.message
    with GrpcClient("127.0.0.1", server[1], "sentiment") as grpc_client, pytest.raises(ServingRequestError) as e:
        grpc_client.regress([{"text": "a"}], signature_name="classify")
    assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT


class NativeClassifier(tf.Module):
    """A TF2 classifier as tf.saved_model.save writes it: every signature's method name is predict."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify(self, inputs):
        words = tf.io.parse_example(inputs, {"text": tf.io.FixedLenFeature([], tf.string)})["text"]
        n = tf.cast(tf.strings.length(words), tf.float32)  # [B]
        scores = tf.stack([1.0 / (1.0 + n), n / (1.0 + n)], axis=1)
        return {"scores": scores, "classes": tf.tile(tf.constant([["short", "long"]]), [tf.shape(inputs)[0], 1])}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress(self, inputs):
        words = tf.io.parse_example(inputs, {"text": tf.io.FixedLenFeature([], tf.string)})["text"]
        return {"outputs": tf.cast(tf.strings.length(words), tf.float32)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def text(self, text):
        return {"scores": tf.zeros([tf.shape(text)[0], 2])}


def test_native_tf2_signatures_serve_classify_and_regress_unless_method_names_are_checked(tmp_path):
    from electra_tf.serving.manager import LoadOptions
    from electra_tf.serving.server import ModelServer

    module = NativeClassifier()
    tf.saved_model.save(module, str(tmp_path / "native" / "1"),
                        signatures={"serving_default": module.classify, "regress": module.regress, "text": module.text})
    pb = tmp_path / "native" / "1" / "saved_model.pb"
    saved = saved_model_pb2.SavedModel.FromString(pb.read_bytes())
    saved.meta_graphs[0].signature_def["text"].method_name = "custom/method"  # neither predict, classify nor regress
    pb.write_bytes(saved.SerializeToString())
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name, predict.model_spec.signature_name = "native", "text"
    predict.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([b"a"], dtype=object)))
    examples = [_example(text="ab"), _example(text="abcd")]
    for check in (False, True):
        with ModelServer(str(tmp_path / "native"), rest_port=None, load_options=LoadOptions(check_method_names=check)) as server, \
                grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            classify = _classification_request("native", "", examples)
            regress = regression_pb2.RegressionRequest(model_spec=_classification_request("native", "regress").model_spec,
                                                       input=classify.input)
            if not check:  # TF Serving's default: the signatures' shapes decide
                result = stub.Classify(classify, timeout=60).result.classifications
                assert [[c.label for c in r.classes] for r in result] == [["short", "long"]] * 2
                np.testing.assert_allclose([[c.score for c in r.classes] for r in result],
                                           [[1 / 3, 2 / 3], [1 / 5, 4 / 5]], rtol=1e-6)
                assert [r.value for r in stub.Regress(regress, timeout=60).result.regressions] == [2.0, 4.0]
                assert stub.Predict(predict, timeout=60).outputs["scores"].tensor_shape.dim[0].size == 1
                refusals = {  # what TF Serving checks whatever the method name (classifier.cc, regressor.cc)
                    "text": (classify, "No classification inputs found in SignatureDef"),
                    "serving_default": (regress, "Expected one output Tensor."),
                    "regress": (classify, 'Expected classification signature outputs to contain at least one of'
                                          ' "classes" or "scores"'),
                }
            else:
                refusals = {"serving_default": (classify, "Expected classification signature method_name to be"
                                                          " tensorflow/serving/classify. Was: tensorflow/serving/predict"),
                            "regress": (regress, "Expected regression signature method_name")}
                with pytest.raises(grpc.RpcError) as e:  # predict_util.cc: an INTERNAL error
                    stub.Predict(predict, timeout=60)
                assert e.value.code() == grpc.StatusCode.INTERNAL and "Expected prediction signature method_name to be" \
                    " one of {tensorflow/serving/predict, tensorflow/serving/classify, tensorflow/serving/regress}." \
                    " Was: custom/method" in e.value.details(), e.value.details()
            for signature, (request, words) in refusals.items():
                request = type(request).FromString(request.SerializeToString())
                request.model_spec.signature_name = signature
                method = stub.Classify if isinstance(request, classification_pb2.ClassificationRequest) else stub.Regress
                with pytest.raises(grpc.RpcError) as e:
                    method(request, timeout=60)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details(), (
                    signature, e.value.details())
