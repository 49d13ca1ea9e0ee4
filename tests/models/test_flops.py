import pytest

from electra_tf.config import ElectraConfig
from electra_tf.models.flops import training_flops_per_sequence


def test_electra_small_is_about_70_mflop_per_token():
    c = ElectraConfig.from_json("electra_small")
    per_token = training_flops_per_sequence(c, 128)["training"] / 128
    assert 65e6 < per_token < 75e6


def test_objectives_are_ordered_by_their_extra_work():
    c = ElectraConfig.from_json("electra_demo")
    flops = {o: training_flops_per_sequence(c.replace(objective=o), 64)["training"]
             for o in ("mlm", "electra", "electra_15", "replace_mlm", "all_tokens_mlm")}
    assert flops["mlm"] < flops["electra"] == flops["electra_15"]
    assert flops["electra"] < flops["all_tokens_mlm"]
    assert flops["replace_mlm"] > flops["mlm"]
    # The BERT baseline is the discriminator plus an MLM head at the masked slots, no generator.
    g = training_flops_per_sequence(c, 64)["generator_forward"]
    assert g > 0 and training_flops_per_sequence(c.replace(objective="mlm"), 64)[
        "generator_forward"] == 0


def test_matches_a_hand_count_for_a_one_layer_model():
    c = ElectraConfig(vocab_size=100, embedding_size=8, hidden_size=16, num_layers=1, num_heads=1,
                      intermediate_size=32, objective="mlm", max_predictions_per_seq=2,
                      cls_token_id=1, sep_token_id=2, mask_token_id=3)
    s = 4
    encoder = s * (2 * (4 * 16 * 16 + 2 * 16 * 32) + 4 * s * 16 + 2 * 8 * 16)
    head = 2 * 2 * (16 * 8 + 8 * 100)
    assert training_flops_per_sequence(c, s)["training"] == 3 * (encoder + head)
