import json

import pytest

from electra_tf.config import ConfigError, ElectraConfig

PAPER = {  # paper Table 6: layers, hidden, FFN, heads, E, generator fraction, mask prob
    "electra_small": (12, 256, 1024, 4, 128, 0.25, 0.15),
    "electra_base": (12, 768, 3072, 12, 768, 1 / 3, 0.15),
    "electra_large": (24, 1024, 4096, 16, 1024, 0.25, 0.25),
    "electra_small_plus": (12, 256, 1024, 4, 128, 1.0, 0.15),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_sizes(name):
    c = ElectraConfig.from_json(name)
    layers, hidden, ffn, heads, emb, gen, mask = PAPER[name]
    assert (c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.embedding_size) == (
        layers, hidden, ffn, heads, emb)
    assert c.generator_hidden_size == pytest.approx(gen, abs=1e-4)
    assert c.mask_prob == mask
    assert (c.vocab_size, c.max_position_embeddings, c.type_vocab_size) == (30522, 512, 2)
    assert (c.hidden_act, c.layer_norm_epsilon, c.initializer_range) == ("gelu", 1e-12, 0.02)
    assert (c.disc_weight, c.temperature, c.objective) == (50.0, 1.0, "electra")


@pytest.mark.parametrize("name,hidden,heads,ffn", [
    ("electra_small", 64, 1, 256), ("electra_base", 256, 4, 1024),
    ("electra_large", 256, 4, 1024), ("electra_small_plus", 256, 4, 1024)])
def test_generator_config_follows_the_reference_rule(name, hidden, heads, ffn):
    disc = ElectraConfig.from_json(name)
    gen = disc.generator_config()
    assert (gen.hidden_size, gen.num_heads, gen.intermediate_size) == (hidden, heads, ffn)
    assert gen.num_layers == disc.num_layers and gen.embedding_size == disc.embedding_size


def test_generator_layer_fraction():
    gen = ElectraConfig(num_layers=12, generator_layers=0.5).generator_config()
    assert gen.num_layers == 6


def test_max_predictions_rule():
    c = ElectraConfig()
    assert c.num_masked_slots(128) == 19  # int((0.15 + 0.005) * 128)
    assert c.num_masked_slots(512) == 79
    assert ElectraConfig(mask_prob=0.25).num_masked_slots(512) == 130


@pytest.mark.parametrize("field,value,message", [
    ("num_heads", 3, "not divisible"),
    ("generator_hidden_size", 1.5, "fraction"),
    ("generator_hidden_size", 0.0, "fraction"),
    ("mask_prob", 1.0, "mask_prob"),
    ("objective", "bert", "objective"),
    ("embedding_sharing", "some", "embedding_sharing"),
    ("hidden_dropout", 1.0, "hidden_dropout"),
    ("num_layers", "12", "integer"),
    ("disallow_correct", 1, "true or false"),
    # JSON's NaN / Infinity passed every range check (NaN compares false); epsilon 0 divides by 0.
    ("temperature", float("nan"), "must be a finite number"),
    ("initializer_range", float("inf"), "must be a finite number"),
    ("layer_norm_epsilon", 0.0, "must be > 0"),
])
def test_bad_values_name_the_field(tmp_path, field, value, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({field: value}))
    with pytest.raises(ConfigError) as err:
        ElectraConfig.from_json(path)
    assert field in str(err.value) and message in str(err.value) and str(path) in str(err.value)


def test_unknown_key_and_bad_json(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"hidden_sise": 256}))
    with pytest.raises(ConfigError, match="unknown field.*hidden_sise"):
        ElectraConfig.from_json(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ElectraConfig.from_json(path)
    with pytest.raises(ConfigError, match="not found"):
        ElectraConfig.from_json(tmp_path / "missing.json")


def test_all_tying_needs_a_same_size_generator():
    with pytest.raises(ConfigError, match="embedding_sharing"):
        ElectraConfig(embedding_sharing="all", generator_hidden_size=0.25)
    ElectraConfig(embedding_sharing="all", generator_hidden_size=1.0)


def test_json_round_trip_and_overrides(tmp_path):
    c = ElectraConfig.from_json("electra_base")
    c.to_json(tmp_path / "c.json")
    assert ElectraConfig.from_json(tmp_path / "c.json") == c
    d = c.with_overrides(["num_layers=2", "objective=mlm", "disallow_correct=true"])
    assert (d.num_layers, d.objective, d.disallow_correct) == (2, "mlm", True)
    with pytest.raises(ConfigError, match="key=value"):
        c.with_overrides(["num_layers"])


def test_special_ids_and_vocab_size_come_from_the_vocab_file(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    c = ElectraConfig.from_json("electra_tiny").with_vocab(vocab)
    assert (c.vocab_size, c.pad_token_id, c.cls_token_id, c.sep_token_id, c.mask_token_id) == (
        7, 0, 2, 3, 4)


def test_every_config_type_loads_and_validates_the_same_way(tmp_path):
    from electra_tf.finetune.config import FinetuningConfig
    from electra_tf.training.config import PretrainingConfig, PretrainingConfigError

    for cls, field, bad in ((FinetuningConfig, "learning_rate", -1.0),
                            (PretrainingConfig, "train_batch_size", 0)):
        good = cls()
        good.to_json(tmp_path / "c.json")
        assert cls.from_json(tmp_path / "c.json") == good
        (tmp_path / "bad.json").write_text(json.dumps({field: bad}))
        with pytest.raises(ConfigError, match=f"bad.json.*{field}"):
            cls.from_json(tmp_path / "bad.json")
        (tmp_path / "bad.json").write_text(json.dumps({"no_such_field": 1}))
        with pytest.raises(ConfigError, match="unknown field.*no_such_field"):
            cls.from_json(tmp_path / "bad.json")
    assert issubclass(PretrainingConfigError, ConfigError)


def test_every_config_type_checks_field_types_the_same_way():
    from electra_tf.finetune.config import FinetuningConfig
    from electra_tf.training.config import PretrainingConfig, PretrainingConfigError

    cases = ((ElectraConfig, ConfigError, "max_predictions_per_seq", 1.5, "must be an integer or null"),
             (ElectraConfig, ConfigError, "hidden_act", 1, "must be a string"),
             (FinetuningConfig, ConfigError, "keep_best", "yes", "must be true or false"),
             (PretrainingConfig, PretrainingConfigError, "learning_rate", "1e-4", "must be a finite number"),
             # NaN passed the range checks and ended as a diverged loss, "lower --learning_rate".
             (PretrainingConfig, PretrainingConfigError, "weight_decay", float("nan"), "must be a finite number"),
             (FinetuningConfig, ConfigError, "weight_decay", float("inf"), "must be a finite number"),
             (FinetuningConfig, ConfigError, "null_score_diff_threshold", float("-inf"), "must be a finite number"))
    for cls, error, field, value, message in cases:
        with pytest.raises(error, match=rf"^{cls.__name__}\.{field}: {message} \(got {value!r}\)$"):
            cls(**{field: value})
