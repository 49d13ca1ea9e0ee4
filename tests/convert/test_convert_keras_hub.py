"""electra_tf/convert/keras_hub.py: our discriminator as a keras-hub ELECTRA preset, and back.

The module docstring states what differs (keras-hub's tanh GELU, its pooler, its pre-tokenizer)
with the numbers measured; these tests pin each difference and show nothing else differs.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

keras_hub = pytest.importorskip(
    "keras_hub",
    reason="keras-hub is the optional keras_hub extra: pip install 'electra_tf[keras_hub]'")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from electra_tf.config import ElectraConfig  # noqa: E402
from electra_tf.convert import (  # noqa: E402
    ConversionError, convert, detect_format, from_pretrained, load_pretrained,
    save_electra_checkpoint)
from electra_tf.convert.keras_hub import (  # noqa: E402
    MARKER, from_keras_hub_backbone, from_keras_hub_preset, read_preset_config,
    to_keras_hub_backbone)
from electra_tf.convert.pretrained import to_keras_hub_preset  # noqa: E402
from electra_tf.data.tokenizer import WordpieceTokenizer  # noqa: E402
from electra_tf.models import Discriminator  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SENTENCES = [
    "The film's opening scene is beautiful, but the plot falls apart by the second hour.",
    "I watched it twice (in 2019 and again in 2023) and laughed both times!",
    "Café owners in Zürich said the naïve hero was “too good to be true”.",
    "Kurosawa's 七人の侍 is still the benchmark; nothing else comes close.",
    "Unbelievably overlong -- a 3-hour slog with no payoff whatsoever?!",
    "She said: don't waste your money on this one.",
]
# Text where keras-hub's pre-tokenizer is not BERT's (module docstring, item 5).
DIFFERENT = {"control character": "the music\x97but not the plot",
             "zero-width space": "good\u200bmovie",
             "NFKC case folding": "wait\u2026 the \ufb01lm is fine"}


def make_vocab(path, lower_case: bool) -> str:
    """Specials, every character alone and as a ##piece, and the sentences' words: rarer spellings
    fall back to pieces, and nothing is [UNK]."""
    import re
    import unicodedata

    text = " ".join(SENTENCES + list(DIFFERENT.values()))
    if lower_case:
        text = "".join(c for c in unicodedata.normalize("NFD", text.lower())
                       if unicodedata.category(c) != "Mn")
    words = [w for w in re.findall(r"\w+|[^\w\s]", text) if w.isprintable()]
    chars = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars),
             *sorted(set(words) - set(chars))]
    Path(path).write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return make_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt", lower_case=True)


@pytest.fixture(scope="module")
def disc(vocab_file):
    """The tiny discriminator (E=32 != H=64: the projection is converted too), initialised 10x
    wider than ELECTRA's 0.02 so the FFN's inputs reach the range where the two GELUs differ,
    as a trained model's do (at 0.02 the difference is round-off: module docstring)."""
    keras.utils.set_random_seed(0)
    config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file).replace(
        initializer_range=0.2)
    return Discriminator(config)


@pytest.fixture(scope="module")
def inputs(vocab_file):
    """Sentence pairs as fine-tuning features: [CLS] a [SEP] b [SEP], segment ids 0/1, padded."""
    tok = WordpieceTokenizer(vocab_file)
    ids = np.zeros((3, 48), "int32")
    segments, mask = np.zeros_like(ids), np.zeros_like(ids)
    for row in range(3):
        a, b = (tok.encode(s)[:20] for s in SENTENCES[2 * row:2 * row + 2])
        tokens = [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
        ids[row, :len(tokens)] = tokens
        segments[row, len(a) + 2:len(tokens)] = 1
        mask[row, :len(tokens)] = 1
    assert tok.unk_id not in ids
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def keras_hub_inputs(inputs):
    return {"token_ids": inputs["input_ids"], "padding_mask": inputs["input_mask"],
            "segment_ids": inputs["segment_ids"]}


# Two attention implementations in float32 (ours folds the scale into one QKV matmul) agree to
# ~3e-6 on these models; the GELU gap is 30-500x that.
ROUND_OFF = 2e-5


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def use_exact_gelu(backbone):
    for layer in backbone.transformer_layers:
        layer._feedforward_intermediate_dense.activation = (
            lambda x: keras.activations.gelu(x, approximate=False))


def assert_same_encoder(a, b):
    """Same encoder weights in the same order (heads aside)."""
    def encoder(model):
        return [v for v in model.weights if "discriminator_predictions" not in v.path]

    def names(model):  # without the model's own name
        return [v.path.split("/", 1)[1] for v in encoder(model)]

    assert names(a) == names(b)
    for x, y in zip(encoder(a), encoder(b)):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


def test_backbone_differs_from_ours_only_by_the_gelu(disc, inputs):
    backbone, report = to_keras_hub_backbone(disc)
    ours = disc(inputs)
    theirs = backbone(keras_hub_inputs(inputs))
    gelu_gap = max_diff(ours["sequence_output"], theirs["sequence_output"])
    # The tanh GELU shows (1.2e-3 here; module docstring: 4.7e-4 on a trained model).
    assert 2e-4 < gelu_gap < 5e-3, gelu_gap
    # Our model on keras-hub's GELU gives keras-hub's numbers...
    approximate, _ = from_keras_hub_backbone(backbone, hidden_act="gelu_approximate")
    assert max_diff(approximate(inputs)["sequence_output"], theirs["sequence_output"]) < ROUND_OFF
    # ...and keras-hub on the exact GELU gives ours: the GELU is the only difference.
    use_exact_gelu(backbone)
    exact = backbone(keras_hub_inputs(inputs))
    assert max_diff(ours["sequence_output"], exact["sequence_output"]) < ROUND_OFF
    # The pooler, which ELECTRA does not have, is written as the identity: tanh(h_[CLS]).
    assert max_diff(exact["pooled_output"], np.tanh(ours["cls_output"])) < ROUND_OFF

    assert len(report.mapped) == len(backbone.weights) - 2
    assert {reason for _, reason in report.ignored} == {
        "discriminator_predictions head (a keras-hub backbone has none)"}
    assert len(report.ignored) == 4
    assert [name.split(" ")[0] for name, _ in report.missing] == [
        "pooled_dense/kernel", "pooled_dense/bias"]


def test_electra_small_shape(inputs):
    """The realistic size of the module docstring: ELECTRA-Small, ELECTRA's own 0.02 init."""
    keras.utils.set_random_seed(0)
    disc = Discriminator(ElectraConfig.from_json("electra_small"), rtd_head=False)
    backbone, report = to_keras_hub_backbone(disc)
    assert len(report.mapped) == 12 * 16 + 7 and not report.ignored
    ours = disc(inputs)["sequence_output"]
    gelu_gap = max_diff(ours, backbone(keras_hub_inputs(inputs))["sequence_output"])
    assert 1e-5 < gelu_gap < 1e-3, gelu_gap
    use_exact_gelu(backbone)
    assert max_diff(ours, backbone(keras_hub_inputs(inputs))["sequence_output"]) < ROUND_OFF


def test_a_pretrainer_gives_its_discriminator(disc, inputs):
    from electra_tf.models import ElectraPretrainer

    pretrainer = ElectraPretrainer(disc.config)
    backbone, report = to_keras_hub_backbone(pretrainer)
    assert len(report.mapped) == len(backbone.weights) - 2
    reasons = {reason for _, reason in report.ignored}
    assert reasons == {"discriminator_predictions head (a keras-hub backbone has none)",
                       "generator (a keras-hub backbone holds one encoder)"}
    use_exact_gelu(backbone)
    assert max_diff(pretrainer.discriminator(inputs)["sequence_output"],
                    backbone(keras_hub_inputs(inputs))["sequence_output"]) < ROUND_OFF


def test_preset_round_trip_through_keras_hub(tmp_path, disc, inputs, vocab_file):
    save_electra_checkpoint(disc, disc.config, tmp_path / "ours", vocab_file=vocab_file)
    report = to_keras_hub_preset(tmp_path / "ours", tmp_path / "preset")
    preset = tmp_path / "preset"
    for name in ("config.json", "model.weights.h5", "tokenizer.json",
                 "assets/tokenizer/vocabulary.txt", MARKER):
        assert (preset / name).is_file(), name
    assert report.target == f"keras_hub:{preset}" and report.counts()["unknown"] == 0

    # keras-hub reads it as its own.
    backbone = keras_hub.models.Backbone.from_preset(str(preset))
    assert isinstance(backbone, keras_hub.models.ElectraBackbone)
    direct, _ = to_keras_hub_backbone(disc)
    np.testing.assert_array_equal(backbone(keras_hub_inputs(inputs))["sequence_output"],
                                  direct(keras_hub_inputs(inputs))["sequence_output"])

    # And we read it back: same weights, config and vocabulary; the RTD head is gone.
    assert detect_format(preset) == "keras_hub"
    loaded = load_pretrained(preset)
    model, config, vocab = loaded.model, loaded.config, loaded.vocab_path
    assert loaded.format == "keras_hub" and model.rtd_head is None
    assert config == disc.config
    assert Path(vocab).read_text(encoding="utf-8") == Path(vocab_file).read_text(encoding="utf-8")
    assert_same_encoder(disc, model)
    np.testing.assert_array_equal(model(inputs)["sequence_output"],
                                  disc(inputs)["sequence_output"])
    assert [name for name, _ in loaded.report.ignored] == ["pooled_dense/kernel",
                                                           "pooled_dense/bias"]
    # hidden_act="gelu_approximate" reproduces keras-hub's outputs.
    approximate, config, _ = from_keras_hub_preset(preset, hidden_act="gelu_approximate")
    assert config.hidden_act == "gelu_approximate"
    assert max_diff(approximate(inputs)["sequence_output"],
                    backbone(keras_hub_inputs(inputs))["sequence_output"]) < ROUND_OFF


def test_preset_written_by_keras_hub(tmp_path, vocab_file, inputs):
    """A preset we did not write (no electra_tf_preset.json): the config comes from keras-hub's."""
    from electra_tf.data.tokenizer import load_vocab

    keras.utils.set_random_seed(1)
    vocab = load_vocab(vocab_file)
    backbone = keras_hub.models.ElectraBackbone(
        vocab_size=len(vocab), num_layers=2, num_heads=4, hidden_dim=64, embedding_dim=32,
        intermediate_dim=128, dropout=0.1, max_sequence_length=64)
    backbone.save_to_preset(str(tmp_path))
    tokenizer = keras_hub.models.ElectraTokenizer(vocabulary=vocab, lowercase=True)
    tokenizer.save_to_preset(str(tmp_path))

    model, config, vocab_path = from_pretrained(tmp_path)
    assert (config.hidden_size, config.embedding_size, config.num_heads, config.num_layers,
            config.max_position_embeddings, config.hidden_act) == (64, 32, 4, 2, 64, "gelu")
    assert (config.cls_token_id, config.sep_token_id, config.mask_token_id) == (2, 3, 4)
    assert read_preset_config(tmp_path)[2] is True and vocab_path.endswith("vocabulary.txt")
    approximate, _, _ = from_keras_hub_preset(tmp_path, hidden_act="gelu_approximate")
    assert max_diff(approximate(inputs)["sequence_output"],
                    backbone(keras_hub_inputs(inputs))["sequence_output"]) < ROUND_OFF


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_preset_tokenizer_tokenizes_like_ours(tmp_path, lower_case):
    vocab_file = make_vocab(tmp_path / "vocab.txt", lower_case)
    config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file)
    to_keras_hub_preset(Discriminator(config), tmp_path / "preset", vocab_file=vocab_file,
                        lower_case=lower_case)
    assert read_preset_config(tmp_path / "preset")[2] is lower_case
    theirs = keras_hub.models.ElectraTokenizer.from_preset(str(tmp_path / "preset"))
    ours = WordpieceTokenizer(vocab_file, lower_case=lower_case)

    def keras_hub_ids(texts):
        ids = theirs(tf.constant(texts))
        return [list(map(int, row)) for row in (ids if isinstance(ids, list) else ids.to_list())]

    expected = ours.encode_batch(SENTENCES)
    assert keras_hub_ids(SENTENCES) == expected
    assert all(ours.unk_id not in row for row in expected)
    # Where the pre-tokenizers differ, as the module docstring says (NFKC only when lower-casing).
    for what, text in DIFFERENT.items():
        same = keras_hub_ids([text]) == ours.encode_batch([text])
        assert same is (what == "NFKC case folding" and not lower_case), (
            f"{what}: keras-hub now tokenizes {text!r} "
            f"{'like' if same else 'unlike'} ours; update electra_tf/convert/keras_hub.py")


def test_casing_comes_from_the_checkpoint(tmp_path, disc, vocab_file):
    """A checkpoint recording lower_case=False gives a cased keras-hub tokenizer."""
    save_electra_checkpoint(disc, disc.config, tmp_path / "ours", vocab_file=vocab_file)
    (tmp_path / "ours" / "tokenizer_config.json").write_text('{"do_lower_case": false}\n')
    to_keras_hub_preset(tmp_path / "ours", tmp_path / "preset")
    assert read_preset_config(tmp_path / "preset")[2] is False
    # and from a preset to a preset, directly or through `convert` (which passes the vocabulary)
    to_keras_hub_preset(tmp_path / "preset", tmp_path / "again")
    convert(tmp_path / "preset", tmp_path / "converted", output_format="keras_hub")
    for name in ("again", "converted"):
        assert read_preset_config(tmp_path / name)[2] is False, name


def test_what_keras_hub_cannot_hold(tmp_path, disc):
    for change in ({"hidden_act": "relu"}, {"layer_norm_epsilon": 1e-6}):
        with pytest.raises(ConversionError, match=next(iter(change))):
            to_keras_hub_backbone(Discriminator(disc.config.replace(**change)))
    small_vocab = make_vocab(tmp_path / "small.txt", lower_case=False)
    with pytest.raises(ConversionError, match="vocabulary size mismatch"):
        to_keras_hub_preset(disc, tmp_path / "bad", vocab_file=small_vocab)
    assert not (tmp_path / "bad").exists()  # checked before anything is written
    to_keras_hub_preset(disc, tmp_path / "preset")  # no vocabulary: a backbone-only preset
    assert not (tmp_path / "preset" / "tokenizer.json").exists()
    with pytest.raises(ConversionError, match="one encoder and no heads"):
        from_pretrained(tmp_path / "preset", "pretrainer")
    with pytest.raises(ConversionError, match="hidden_size: the config says 128"):
        from_pretrained(tmp_path / "preset", config=disc.config.replace(hidden_size=128))


def test_convert_binary_writes_a_keras_hub_preset(tmp_path, disc, vocab_file):
    save_electra_checkpoint(disc, disc.config, tmp_path / "ours", vocab_file=vocab_file)
    result = subprocess.run(
        [sys.executable, "-m", "electra_tf.tools.convert", f"--input={tmp_path / 'ours'}",
         f"--output={tmp_path / 'preset'}", "--output_format=keras_hub"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pooled_dense/kernel (written as the identity" in result.stdout
    assert "discriminator_predictions head (a keras-hub backbone has none)" in result.stdout
    model, config, _ = from_pretrained(tmp_path / "preset")
    assert config == disc.config
    assert_same_encoder(disc, model)
