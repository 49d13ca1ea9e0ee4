"""Electric's scores after a short training on the embedded corpus (electra_tf/experiments/ranking.py).

The measured run (`python -m electra_tf.tools.electric_ranking`, the defaults of `RankingConfig`: 6,000
steps, 28 minutes on the shared 2-core machine) ranks 96.6% of 500 held-out sentences above
their shuffles; its checkpoints pass 90% between 1,500 steps (88%) and 3,000 (94%), when the
discriminator starts to use word order in mid-sentence. The test below runs `QUICK` (1,200
steps at batch 16, length 32, mask_prob 0.6, no dropout; ~110 CPU-s on a 2-core AMD EPYC with
avx2 fma avx512f avx512_vnni avx512_bf16, 2026-12-02): 86.0% of 300 sentences with its seed 0,
86.7% with seed 1 and 86.3% with seed 2 (at length 48, 1.36x the CPU seconds: 91.7%, 92.0% and
85.0%). The bar, 80%, is one every
seed clears; a model blind to word order scores ~50% (80% of 300 is 10 standard deviations above
that). Cheaper sizes tried (fewer steps, a narrower model, see `QUICK`) fell to 62-73% for some
seeds: the claim needs this size.
"""

import dataclasses
import random

import pytest

from electra_tf.experiments.ranking import (
    HELD_OUT_FROM, QUICK, RankingConfig, held_out_sentences, run, shuffle_words)


def test_shuffles_change_the_order_and_keep_the_words():
    rng = random.Random(0)
    for sentence in ("a b", "the film was great .", "so so so good"):
        shuffled = shuffle_words(sentence, rng)
        assert shuffled != sentence and sorted(shuffled.split()) == sorted(sentence.split())
    with pytest.raises(ValueError, match="fewer than two distinct words"):
        shuffle_words("so so so", rng)


def test_held_out_sentences_come_after_the_training_reviews():
    with pytest.raises(ValueError, match="num_documents"):
        RankingConfig(num_documents=HELD_OUT_FROM + 1)
    sentences = held_out_sentences(50, 8, 30, keep=lambda s: "film" in s)
    assert len(sentences) == 50 and all("film" in s for s in sentences)
    assert all(8 <= len(s.split()) <= 30 for s in sentences)


@pytest.mark.slow
def test_a_short_electric_run_scores_real_sentences_above_their_shuffles(tmp_path):
    result = run(dataclasses.replace(QUICK, workdir=str(tmp_path)))
    print({k: v for k, v in result.items() if k not in ("metrics", "config")})
    assert result["num_sentences"] == QUICK.num_sentences
    assert result["accuracy"] >= 0.8
