"""electra_tf/convert/hf.py: Hugging Face ELECTRA (safetensors / pytorch_model.bin) <-> ours."""

import importlib.util
import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import convert_fixtures as fx
from electra_tf.convert import ConversionError, hf
from electra_tf.convert.pretrained import load_pretrained

H, E, V, HEADS = fx.TINY["hidden"], fx.TINY["emb"], fx.TINY["vocab"], 2


def hf_config(architecture, hidden, heads, ffn, **extra):
    return {"architectures": [architecture], "model_type": "electra", "vocab_size": V,
            "embedding_size": E, "hidden_size": hidden, "num_hidden_layers": 2,
            "num_attention_heads": heads, "intermediate_size": ffn, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": fx.TINY["max_pos"], "type_vocab_size": 2,
            "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0, **extra}


def write_hf(folder, state, config):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def assert_same_weights(a, b):
    assert [v.path for v in a.weights] == [v.path for v in b.weights]
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


def test_hf_names_follow_transformers():
    assert hf.hf_name("electra/encoder/layer_3/attention/self/query/kernel") == \
        "electra.encoder.layer.3.attention.self.query.weight"
    assert hf.hf_name("generator/encoder/layer_0/output/LayerNorm/beta") == \
        "electra.encoder.layer.0.output.LayerNorm.bias"
    assert hf.hf_name("electra/embeddings/word_embeddings", prefix="") == "embeddings.word_embeddings.weight"
    assert hf.hf_name("discriminator_predictions/dense_1/kernel") == \
        "discriminator_predictions.dense_prediction.weight"
    assert hf.hf_name("generator_predictions/output_bias") == "generator_lm_head.bias"


def test_import_discriminator_from_hf_safetensors(tmp_path, tiny_tensors, tiny_ckpt):
    state = fx.hf_state(tiny_tensors, "discriminator")
    state["electra.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
    folder = write_hf(tmp_path / "d", state, hf_config("ElectraForPreTraining", H, HEADS, 512))
    loaded = load_pretrained(folder, "discriminator")
    assert loaded.format == "hf" and loaded.config.num_heads == HEADS
    disc = loaded.model
    layer = disc.encoder.layers[1]
    np.testing.assert_array_equal(  # torch [out, in] -> ours [in, heads, head_dim]
        layer.attention._value_dense.kernel.numpy(),
        state["electra.encoder.layer.1.attention.self.value.weight"].T.reshape(H, HEADS, H // HEADS))
    np.testing.assert_array_equal(layer.intermediate.kernel.numpy(),
                                  state["electra.encoder.layer.1.intermediate.dense.weight"].T)
    np.testing.assert_array_equal(disc.rtd_head.dense_1.bias.numpy(),
                                  state["discriminator_predictions.dense_prediction.bias"])
    assert ("electra.embeddings.position_ids", "position_ids buffer") in loaded.report.ignored
    # The same tensors through the TF1 path give the same model.
    assert_same_weights(disc, load_pretrained(tiny_ckpt, "discriminator").model)


def test_import_generator_and_bare_encoder(tmp_path, tiny_tensors, tiny_ckpt):
    state = fx.hf_state(tiny_tensors, "generator")
    state["generator_lm_head.weight"] = state["electra.embeddings.word_embeddings.weight"]  # tied
    folder = write_hf(tmp_path / "g", state, hf_config("ElectraForMaskedLM", 64, 1, 256))
    loaded = load_pretrained(folder, "generator")
    gen = loaded.model
    assert (gen.config.hidden_size, gen.config.embedding_size) == (64, E)
    np.testing.assert_array_equal(gen.lm_head.dense.kernel.numpy(),
                                  tiny_tensors["generator_predictions/dense/kernel"])
    np.testing.assert_array_equal(gen.lm_head.output_bias.numpy(), state["generator_lm_head.bias"])
    assert ("generator_lm_head.weight", "tied to the word embeddings") in loaded.report.ignored
    assert_same_weights(gen, load_pretrained(tiny_ckpt, "generator").model)

    bare = {k: v for k, v in fx.hf_state(tiny_tensors, "discriminator", prefix="").items()
            if not k.startswith("discriminator_predictions")}
    assert "embeddings.word_embeddings.weight" in bare
    folder = write_hf(tmp_path / "m", bare, hf_config("ElectraModel", H, HEADS, 512))
    encoder = load_pretrained(folder, "discriminator").model
    assert encoder.rtd_head is None
    np.testing.assert_array_equal(encoder.embeddings_project.dense.kernel.numpy(),
                                  tiny_tensors["electra/embeddings_project/kernel"])


def test_export_import_round_trip_pretrainer(tmp_path, tiny_ckpt, tiny_tensors):
    source = load_pretrained(tiny_ckpt, "pretrainer")
    report = hf.export_hf(source.model, tmp_path / "hf", vocab_file=source.vocab_path)
    disc_state = load_file(str(tmp_path / "hf" / "discriminator" / "model.safetensors"))
    np.testing.assert_array_equal(disc_state["electra.encoder.layer.0.attention.output.dense.weight"],
                                  tiny_tensors["electra/encoder/layer_0/attention/output/dense/kernel"].T)
    assert disc_state["discriminator_predictions.dense_prediction.weight"].shape == (1, H)
    gen_config = json.loads((tmp_path / "hf" / "generator" / "config.json").read_text())
    assert gen_config["architectures"] == ["ElectraForMaskedLM"] and gen_config["model_type"] == "electra"
    assert (gen_config["hidden_size"], gen_config["embedding_size"], gen_config["num_attention_heads"],
            gen_config["intermediate_size"]) == (64, E, 1, 256)
    assert len(report.mapped) == len(disc_state) + len(
        load_file(str(tmp_path / "hf" / "generator" / "model.safetensors")))
    again = load_pretrained(tmp_path / "hf", "pretrainer")
    assert again.config == source.config
    assert_same_weights(source.model, again.model)
    assert (tmp_path / "hf" / "discriminator" / "vocab.txt").exists()


def test_shape_and_unknown_errors(tmp_path, tiny_tensors):
    state = fx.hf_state(tiny_tensors, "discriminator")
    state["electra.encoder.layer.0.output.dense.weight"] = np.zeros((H, 100), np.float32)
    folder = write_hf(tmp_path / "bad", state, hf_config("ElectraForPreTraining", H, HEADS, 512))
    with pytest.raises(ConversionError, match=r"electra.encoder.layer.0.output.dense.weight: "
                                              r"checkpoint shape \[128, 100\].*needs \[128, 512\]"):
        load_pretrained(folder, "discriminator")
    state = {**fx.hf_state(tiny_tensors, "discriminator"), "classifier.weight": np.zeros((2, H), np.float32)}
    folder = write_hf(tmp_path / "extra", state, hf_config("ElectraForPreTraining", H, HEADS, 512))
    with pytest.raises(ConversionError, match=r"unknown.*classifier.weight \[2, 128\]"):
        load_pretrained(folder, "discriminator")
    write_hf(tmp_path / "v", fx.hf_state(tiny_tensors, "discriminator"),
             hf_config("ElectraForPreTraining", H, HEADS, 512, vocab_size=200))
    with pytest.raises(ConversionError, match="vocabulary size mismatch.*200.*112"):
        load_pretrained(tmp_path / "v", "discriminator")
    folder = write_hf(tmp_path / "no_mask", fx.hf_state(tiny_tensors, "discriminator"),
                      hf_config("ElectraForPreTraining", H, HEADS, 512))
    fx.write_vocab(folder / "vocab.txt", V)
    (folder / "vocab.txt").write_text((folder / "vocab.txt").read_text().replace("[MASK]\n", "[MASK2]\n"))
    with pytest.raises(ConversionError, match=r"vocab.txt: missing special token\(s\) \[MASK\]"):
        load_pretrained(folder, "discriminator")


def test_config_mapping():
    c = hf.config_from_hf(hf_config("ElectraForPreTraining", H, HEADS, 512, hidden_act="gelu_new",
                                    layer_norm_eps=1e-7, attention_probs_dropout_prob=0.2))
    assert (c.hidden_act, c.layer_norm_epsilon, c.attention_dropout, c.num_heads) == \
        ("gelu_approximate", 1e-7, 0.2, HEADS)
    back = hf.config_to_hf(c, "ElectraForPreTraining")
    assert (back["hidden_act"], back["layer_norm_eps"], back["num_hidden_layers"]) == ("gelu_new", 1e-7, 2)
    with pytest.raises(ConversionError, match="hidden_act 'swish'"):
        hf.config_from_hf({"hidden_act": "swish"})


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_pytorch_bin_without_torch_says_so(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    (folder / "config.json").write_text(json.dumps(hf_config("ElectraForPreTraining", H, HEADS, 512)))
    with pytest.raises(ConversionError, match="needs torch"):
        load_pretrained(folder, "discriminator")


def _cased_vocab(path, size):
    """A cased vocabulary of `size` tokens with "Apple" and "apple" as whole words."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Apple", "apple", "pie", "."]
    tokens += [f"[unused{i}]" for i in range(size - len(tokens))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(tokens) + "\n")
    return path


def test_tokenizer_config_carries_the_casing(tmp_path, tiny_ckpt):
    from electra_tf.convert.pretrained import convert, save_electra_checkpoint
    from electra_tf.data.casing import checkpoint_lower_case

    disc = load_pretrained(tiny_ckpt, "discriminator")
    vocab = _cased_vocab(tmp_path / "vocab" / "vocab.txt", V)
    hf.export_hf(disc.model, tmp_path / "cased", vocab_file=vocab, lower_case=False)
    written = json.loads((tmp_path / "cased" / "tokenizer_config.json").read_text())
    assert written["do_lower_case"] is False and written["strip_accents"] is None
    assert checkpoint_lower_case(tmp_path / "cased")[0] is False  # read back on import
    # A pretraining run that recorded lower_case=false, converted with electra-convert's
    # `convert`: the casing comes along with the vocabulary.
    run = tmp_path / "run"
    save_electra_checkpoint(disc.model, disc.config, run / "discriminator", vocab_file=vocab)
    (run / "pretraining_config.json").write_text(json.dumps({"pretraining_config": {"lower_case": False}}))
    convert(run / "discriminator", tmp_path / "converted", output_format="hf")
    assert json.loads((tmp_path / "converted" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    # The released (uncased) TF1 layout, with nothing recorded: uncased, as the released models.
    # (it holds a generator too, so both networks are converted: one HF folder each)
    convert(tiny_ckpt, tmp_path / "released", output_format="hf")
    for part in ("discriminator", "generator"):
        written = json.loads((tmp_path / "released" / part / "tokenizer_config.json").read_text())
        assert written["do_lower_case"] is True


def test_transformers_tokenizer_reads_the_exported_casing(tmp_path, tiny_ckpt):
    transformers = pytest.importorskip("transformers")
    disc = load_pretrained(tiny_ckpt, "discriminator")
    vocab = _cased_vocab(tmp_path / "vocab.txt", V)
    ids = {}
    for lower_case in (False, True):
        out = tmp_path / f"lower_{lower_case}"
        hf.export_hf(disc.model, out, vocab_file=vocab, lower_case=lower_case)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
        ids[lower_case] = [tokenizer("Apple pie")["input_ids"], tokenizer("apple pie")["input_ids"]]
    assert ids[False][0] != ids[False][1] and ids[False][0] == [2, 5, 7, 3]
    assert ids[True][0] == ids[True][1] == [2, 6, 7, 3]
