"""The encoder a fine-tuning run starts from: a pretrained discriminator's config, vocabulary,
casing and weights, or a config for random initialisation.

`init_checkpoint` is any format `convert.from_pretrained` reads: our pretraining output
`<pretrain model_dir>/discriminator`, a TF1 release, a Hugging Face folder (a released model's
name is resolved to its local folder before it gets here). Its weights are copied into the
head's encoder by variable path (`assign_encoder_weights`: all or nothing, shapes checked); the
checkpoint's RTD / MLM heads are not used.

Text is lower-cased and accent-stripped or not as the checkpoint's vocabulary was built
(`data.casing`: an HF `tokenizer_config.json`, our pretraining records, a release's folder name;
uncased when nothing says), unless `lower_case` is given; `head_config.json` records it for the
exporter.
"""

from __future__ import annotations

import dataclasses

from electra_tf.config import ElectraConfig


def pretrained_encoder(init_checkpoint):
    """(config, vocab_path or None, {variable path: numpy value}) of a pretrained discriminator."""
    from electra_tf.convert.pretrained import from_pretrained

    model, config, vocab = from_pretrained(init_checkpoint, "discriminator")
    return config, vocab, {v.path: v.numpy() for v in model.weights}


def assign_encoder_weights(head, values: dict, source="checkpoint") -> None:
    """Copies pretrained values into `head.encoder`, matched by variable path.

    Every encoder variable must be found with the same shape; the checkpoint's RTD / MLM heads
    are not used.
    """
    for variable in head.encoder.weights:
        value = values.get(variable.path)
        if value is None:
            raise ValueError(f"{source}: no variable {variable.path!r} for the encoder "
                             f"(it has e.g. {sorted(values)[:3]})")
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{source}: {variable.path!r} has shape {tuple(value.shape)}, "
                             f"the encoder built from its config {tuple(variable.shape)}")
        variable.assign(value)


def load_encoder_weights(head, init_checkpoint) -> ElectraConfig:
    """`assign_encoder_weights` from a checkpoint path; returns the checkpoint's config."""
    config, _, values = pretrained_encoder(init_checkpoint)
    assign_encoder_weights(head, values, init_checkpoint)
    return config


@dataclasses.dataclass
class EncoderSource:
    """Where the encoder comes from: its config and vocabulary, and a checkpoint's weights
    (`values`, variable path -> value; None for random initialisation)."""

    config: ElectraConfig
    vocab_file: str
    init_checkpoint: str | None = None
    values: dict | None = None

    @classmethod
    def of(cls, init_checkpoint, model_config, vocab_file) -> "EncoderSource":
        if init_checkpoint is not None:
            config, checkpoint_vocab, values = pretrained_encoder(init_checkpoint)
            vocab_file = vocab_file or checkpoint_vocab
        else:
            if model_config is None:
                raise ValueError("give init_checkpoint (a pretrained discriminator) or model_config "
                                 "(random initialisation)")
            config = model_config if isinstance(model_config, ElectraConfig) else ElectraConfig.from_json(model_config)
            config = config if vocab_file is None else config.with_vocab(vocab_file)
            values = None
        if vocab_file is None:
            raise ValueError(f"no vocabulary: {init_checkpoint or 'the model config'} has no vocab.txt; "
                             "pass vocab_file")
        return cls(config, vocab_file, None if init_checkpoint is None else str(init_checkpoint), values)

    def tokenizer(self, lower_case: bool | None, *, log, warn):
        """(WordPiece tokenizer, lower_case): the casing given, else the checkpoint's."""
        from electra_tf.data.casing import resolve_lower_case
        from electra_tf.data.tokenizer import WordpieceTokenizer, load_vocab

        vocab = load_vocab(self.vocab_file)
        lower_case = resolve_lower_case(lower_case, self.init_checkpoint, vocab, log=log, warn=warn)
        tokenizer = WordpieceTokenizer(self.vocab_file, lower_case=lower_case)
        if tokenizer.vocab_size > self.config.vocab_size:
            raise ValueError(f"{self.vocab_file}: {tokenizer.vocab_size} tokens, but the model's "
                             f"vocab_size is {self.config.vocab_size}")
        return tokenizer, lower_case

