"""The model config: every hyperparameter of the ELECTRA architecture and objective.

One `ElectraConfig` describes the discriminator; the generator's config is derived from it by the
paper's rule (`generator_config()`). Configs load from `configs/*.json` and are validated on load:
an error names the offending field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

# The pretraining objectives of the paper's Table 5 (Section 3.2 efficiency ablations), and
# Electric (Clark et al., EMNLP 2020; the authors' `electric_objective`, models/electric.py).
OBJECTIVES = ("electra", "electra_15", "replace_mlm", "all_tokens_mlm", "mlm", "electric")
# How generator and discriminator share weights (paper Section 3.2 "Weight sharing").
EMBEDDING_SHARING = ("embeddings", "untied", "all")
ACTIVATIONS = ("gelu", "gelu_approximate", "relu")
# The paper's model sizes (Table 6): the defaults of pretraining and fine-tuning depend on them.
MODEL_SIZES = ("small", "base", "large")
# The special-token ids a model needs; a vocabulary file gives them (`with_vocab`).
SPECIAL_ID_FIELDS = ("pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id")

# The repo's configs/ folder; in an installed wheel the same files are `electra_tf.configs`.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
if not CONFIG_DIR.is_dir():
    CONFIG_DIR = Path(__file__).resolve().parent / "configs"


class ConfigError(ValueError):
    """A config file or value is invalid; the message names the field."""


_JSON_TYPES = {  # annotation -> (check, what the message says it must be)
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    # Finite: JSON files (and float flags) may hold NaN / Infinity, and NaN passes every range
    # check (it compares false), to surface later as a diverged loss.
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
              "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "dict": (lambda v: isinstance(v, dict), "a JSON object"),
}


def check_field_types(config) -> None:
    """Raises the config's `error_type` naming the first field whose value is not of its annotated
    JSON type (int, float, bool, str, dict; `X | None` also takes None). Other annotations are the
    config's own to check."""
    for f in dataclasses.fields(config):
        base, optional, _ = str(f.type).partition(" | None")
        if base not in _JSON_TYPES:
            continue
        check, expected = _JSON_TYPES[base]
        value = getattr(config, f.name)
        if not (optional and value is None) and not check(value):
            raise config.error_type(f"{type(config).__name__}.{f.name}: must be {expected}"
                                    f"{' or null' if optional else ''} (got {value!r})")


class JsonConfig:
    """JSON (de)serialisation with validation, shared by the frozen config dataclasses
    (`ElectraConfig`, `FinetuningConfig`, `PretrainingConfig`).

    Subclasses validate in `__post_init__` (`check_field_types`, then their own rules) and raise
    `error_type` naming the field; loading adds
    the source (file name) to the message and rejects unknown keys. Keys starting with "_" (such
    as "_comment") are ignored.
    """

    error_type = ConfigError

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | os.PathLike) -> None:
        """Replaces `path` (never written through: `files.write_json`)."""
        from electra_tf import files

        files.write_json(path, self.to_dict(), sort_keys=True)

    def replace(self, **changes):
        return self.from_dict({**self.to_dict(), **changes}, source="replace()")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config"):
        error = cls.error_type
        if not isinstance(values, dict):
            raise error(f"{source}: expected a JSON object, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in values.items() if not k.startswith("_")}
        unknown = sorted(set(values) - known)
        if unknown:
            raise error(f"{source}: unknown field(s) {unknown}; known fields: {sorted(known)}")
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in values
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if missing:
            raise error(f"{source}: missing required field(s) {missing}")
        try:
            return cls(**values)
        except error as e:
            raise error(f"{source}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:  # a value of the wrong type met arithmetic
            raise error(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike):
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise cls.error_type(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
        except RecursionError:
            raise cls.error_type(f"{path}: JSON nested too deeply") from None
        except UnicodeDecodeError as e:
            raise cls.error_type(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
        except ValueError as e:  # e.g. an integer of more digits than Python converts
            raise cls.error_type(f"{path}: not valid JSON: {e}") from None
        except OSError as e:
            raise cls.error_type(f"{path}: cannot read config: {e.strerror}") from None
        return cls.from_dict(values, source=str(path))


@dataclasses.dataclass(frozen=True)
class ElectraConfig(JsonConfig):
    """Architecture and pretraining-objective hyperparameters (defaults: ELECTRA-Small).

    Args:
      vocab_size: WordPiece vocabulary size (30,522 for the released BERT uncased vocab).
      embedding_size: width E of the embedding block; projected to `hidden_size` when different.
      hidden_size: width H of the discriminator's transformer.
      num_layers: transformer layers (generator and discriminator have the same depth).
      num_heads: attention heads; `hidden_size` must divide evenly.
      intermediate_size: FFN width (4 H in every released model).
      hidden_act: "gelu" is the exact erf GELU of the original code.
      hidden_dropout: dropout on embeddings, attention output and FFN output.
      attention_dropout: dropout on attention probabilities.
      max_position_embeddings: learned position table size (512).
      type_vocab_size: number of segment ids (2).
      initializer_range: stddev of the truncated-normal initializer (0.02).
      layer_norm_epsilon: 1e-12 as in BERT/ELECTRA.
      generator_hidden_size: generator width as a fraction of `hidden_size` (paper: 1/4 Small and
        Large, 1/3 Base; released Small++: 1.0).
      generator_layers: generator depth as a fraction of `num_layers` (1.0 in all released models).
      embedding_sharing: "embeddings" (default: the whole embedding block is shared), "untied", or
        "all" (every weight tied; needs a same-size generator).
      mask_prob: fraction of tokens masked (0.15; 0.25 for Large).
      max_predictions_per_seq: masked slots per sequence; None derives
        int((mask_prob + 0.005) * max_seq_length) like the original.
      temperature: Gumbel-max sampling temperature (1.0).
      disc_weight: lambda, the discriminator loss weight (50).
      gen_weight: the generator loss weight (1.0; the original's `gen_weight`).
      disallow_correct: forbid sampling the original token (subtract 1000 from its logit).
      objective: one of OBJECTIVES.
      mask_token_id / cls_token_id / sep_token_id / pad_token_id: special ids; the BERT uncased
        layout by default, and overwritten from the vocab file by the data tools.
    """

    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_layers: int = 12
    num_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_epsilon: float = 1e-12
    generator_hidden_size: float = 0.25
    generator_layers: float = 1.0
    embedding_sharing: str = "embeddings"
    mask_prob: float = 0.15
    max_predictions_per_seq: int | None = None
    temperature: float = 1.0
    disc_weight: float = 50.0
    gen_weight: float = 1.0
    disallow_correct: bool = False
    objective: str = "electra"
    pad_token_id: int = 0
    cls_token_id: int = 101
    sep_token_id: int = 102
    mask_token_id: int = 103

    def __post_init__(self):
        self._validate()

    # -- validation ---------------------------------------------------------------------------
    def _validate(self):
        def fail(field, message):
            raise ConfigError(f"ElectraConfig.{field}: {message} (got {getattr(self, field)!r})")

        check_field_types(self)
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_layers", "num_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) < 1:
                fail(name, "must be >= 1")
        if self.hidden_size % self.num_heads:
            fail("num_heads", f"hidden_size {self.hidden_size} is not divisible by num_heads")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                fail(name, "must be in [0, 1)")
        for name in ("generator_hidden_size", "generator_layers"):
            if not 0.0 < getattr(self, name) <= 1.0:
                fail(name, "must be a fraction in (0, 1]")
        if not 0.0 < self.mask_prob < 1.0:
            fail("mask_prob", "must be in (0, 1)")
        if self.temperature <= 0:
            fail("temperature", "must be > 0")
        if self.disc_weight < 0:
            fail("disc_weight", "must be >= 0")
        if self.gen_weight < 0:
            fail("gen_weight", "must be >= 0")
        if self.initializer_range <= 0:
            fail("initializer_range", "must be > 0")
        if self.layer_norm_epsilon <= 0:  # the normalisation divides by sqrt(variance + epsilon)
            fail("layer_norm_epsilon", "must be > 0")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            fail("max_predictions_per_seq", "must be a positive integer or null")
        if self.hidden_act not in ACTIVATIONS:
            fail("hidden_act", f"must be one of {ACTIVATIONS}")
        if self.objective not in OBJECTIVES:
            fail("objective", f"must be one of {OBJECTIVES}")
        if self.embedding_sharing not in EMBEDDING_SHARING:
            fail("embedding_sharing", f"must be one of {EMBEDDING_SHARING}")
        if self.objective == "electric" and self.embedding_sharing == "all":
            # The two-tower generator cannot be the discriminator (the original has no such path).
            fail("embedding_sharing", "objective 'electric' needs 'embeddings' or 'untied'")
        if self.embedding_sharing == "all" and (
            self.generator_hidden_size != 1.0 or self.generator_layers != 1.0
        ):
            fail("embedding_sharing",
                 "'all' ties every weight, so generator_hidden_size and generator_layers must be 1.0")
        for name in SPECIAL_ID_FIELDS:
            if not 0 <= getattr(self, name) < self.vocab_size:
                fail(name, f"must be a token id in [0, vocab_size={self.vocab_size})")

    # -- derived values -----------------------------------------------------------------------
    def generator_config(self) -> "ElectraConfig":
        """The generator's config by the original rule (`util/training_utils.get_bert_config`).

        Same depth (times `generator_layers`), hidden = round(fraction * H), heads = hidden // 64
        (at least 1), FFN = 4 * hidden. Embedding width E is unchanged: the embeddings are shared.
        """
        hidden = max(1, int(round(self.hidden_size * self.generator_hidden_size)))
        if self.generator_hidden_size == 1.0:
            heads, ffn = self.num_heads, self.intermediate_size
        else:
            heads, ffn = max(1, hidden // 64), 4 * hidden
        if hidden % heads:
            heads = 1
        # An untied generator has its own embedding table as wide as its hidden size (the
        # original passes embedding_size=None for untied generator embeddings): no projection.
        embedding_size = hidden if self.embedding_sharing == "untied" else self.embedding_size
        return dataclasses.replace(
            self,
            embedding_size=embedding_size,
            hidden_size=hidden,
            num_heads=heads,
            intermediate_size=ffn,
            num_layers=max(1, int(round(self.num_layers * self.generator_layers))),
            generator_hidden_size=1.0,
            generator_layers=1.0,
            embedding_sharing="embeddings" if self.embedding_sharing == "all" else self.embedding_sharing,
        )

    def with_vocab(self, vocab_file: str | os.PathLike) -> "ElectraConfig":
        """Takes vocab_size and the special-token ids from a vocab file (not from constants).

        A learned vocab puts [CLS] at 2, the BERT uncased one at 101: masking must know which.
        """
        from electra_tf.data.tokenizer import load_vocab, special_token_ids  # TensorFlow: local

        vocab = load_vocab(str(vocab_file))
        ids = special_token_ids(vocab)
        return self.replace(vocab_size=len(vocab), **{name: ids[name] for name in SPECIAL_ID_FIELDS})

    @property
    def model_size(self) -> str:
        """The paper's size this model takes its training defaults from, by its hidden size:
        "large" from 1024 (Large), "base" from 768 (Base), else "small" (Small is 256; the demo's
        and the tests' smaller models too)."""
        if self.hidden_size >= 1024:
            return "large"
        if self.hidden_size >= 768:
            return "base"
        return "small"

    def num_masked_slots(self, seq_length: int) -> int:
        """N, masked positions per sequence: int((mask_prob + 0.005) * seq_length) as the original."""
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        return max(1, int((self.mask_prob + 0.005) * seq_length))

    # -- (de)serialisation: JsonConfig, plus names of the repo's configs/ -------------------------
    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "ElectraConfig":
        """Loads `path`, or a name such as "electra_small" from the repo's `configs/`."""
        return super().from_json(resolve_config_path(path))

    def with_overrides(self, overrides: list[str] | None) -> "ElectraConfig":
        """Applies `key=value` strings (from `--override` flags); values parse as JSON."""
        changes = {}
        for item in overrides or []:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ConfigError(f"--override {item!r}: expected key=value")
            try:
                changes[key.strip()] = json.loads(raw)
            except json.JSONDecodeError:
                changes[key.strip()] = raw
        return self.from_dict({**self.to_dict(), **changes}, source="--override") if changes else self


def resolve_config_path(path: str | os.PathLike) -> Path:
    candidate = Path(path)
    if candidate.exists():
        return candidate
    named = CONFIG_DIR / (candidate.name if candidate.suffix == ".json" else f"{candidate}.json")
    if named.exists():
        return named
    raise ConfigError(
        f"config {str(path)!r} not found (neither a file nor one of "
        f"{sorted(p.stem for p in CONFIG_DIR.glob('*.json'))})"
    )
