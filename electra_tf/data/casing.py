"""Whether text is lower-cased (and accents stripped): a property of the vocabulary and checkpoint.

A vocabulary learned from lower-cased text has no "Apple", and one learned from cased text needs
"Apple" kept: the normalisation is fixed when the vocabulary is built and must be the same
wherever text meets that vocabulary (pretraining shards, fine-tuning, the SavedModel's in-graph
tokenizer, a Hugging Face export). Each of those records it once; this module reads it back.

`checkpoint_lower_case(path)` looks, in order, for:
  - `tokenizer_config.json` `do_lower_case` (a Hugging Face folder, or its `discriminator/`);
  - `tokenizer.json` `config.lowercase` (a keras-hub preset);
  - `lower_case` in an electra_tf folder's `electra_tf_checkpoint.json` or `config.json`, in a
    fine-tuned model's `head_config.json`, or in `pretraining_config.json` of the folder or of
    its parent (`save_electra_checkpoint` writes the discriminator to `<model_dir>/discriminator`),
    at the top level or one level down ("pretraining_config", "manifest", ...);
  - the folder's name, as releases are named: "uncased" -> lower-case, "cased" -> keep case
    (BERT's `cased_L-12_H-768_A-12`; the authors' ELECTRA archives hold uncased models only and
    their `configure_finetuning.py` sets `do_lower_case = True`).
It returns None when nothing records the casing; `resolve_lower_case` then defaults to uncased
(the authors' choice) and says so in the log.

Example:
>>> lower, where = checkpoint_lower_case("hf/bert-base-cased")   # (False, ".../tokenizer_config.json")
>>> resolve_lower_case(None, "hf/bert-base-cased")               # False, logged with its source
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterable

# JSON files of a checkpoint folder that may carry a `lower_case` field.
_RECORDS = ("electra_tf_checkpoint.json", "config.json", "head_config.json",
            "pretraining_config.json")
_UNCASED_NAME = re.compile(r"(^|[^a-z])uncased", re.IGNORECASE)
_CASED_NAME = re.compile(r"(^|[^a-z])cased", re.IGNORECASE)
SPECIAL_TOKEN = re.compile(r"^\[[^\]]+\]$")  # [CLS], [unused12], ...


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _lower_case_field(data) -> bool | None:
    """`lower_case` at the top level of a JSON object or in one of its object values."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("lower_case"), bool):
        return data["lower_case"]
    for value in data.values():
        if isinstance(value, dict) and isinstance(value.get("lower_case"), bool):
            return value["lower_case"]
    return None


def name_lower_case(name: str) -> bool | None:
    """True for a name with "uncased", False with "cased" alone, else None."""
    if _UNCASED_NAME.search(name):
        return True
    if _CASED_NAME.search(name):
        return False
    return None


def checkpoint_lower_case(path) -> tuple[bool | None, str | None]:
    """(lower_case, where it was read) for a checkpoint path, or (None, None) if not recorded.

    `path` is a folder (Hugging Face, electra_tf, a TF1 archive, a fine-tuned `best/`) or a TF1
    checkpoint prefix (`.../electra_small/model.ckpt-1000000`), whose folder is then read.
    """
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    for hf_folder in (folder, folder / "discriminator"):
        config = hf_folder / "tokenizer_config.json"
        data = _read_json(config) if config.exists() else None
        if isinstance(data, dict) and isinstance(data.get("do_lower_case"), bool):
            return data["do_lower_case"], f"{config} (do_lower_case)"
    preset = folder / "tokenizer.json"  # a keras-hub preset: {"config": {"lowercase": ...}}
    data = _read_json(preset) if preset.exists() else None
    if isinstance(data, dict) and isinstance(data.get("config"), dict) and \
            isinstance(data["config"].get("lowercase"), bool):
        return data["config"]["lowercase"], f"{preset} (lowercase)"
    candidates = [folder / name for name in _RECORDS] + [folder.parent / "pretraining_config.json"]
    for record in candidates:
        if record.exists():
            value = _lower_case_field(_read_json(record))
            if value is not None:
                return value, f"{record} (lower_case)"
    for named in (folder, p) if folder != p else (folder,):
        value = name_lower_case(named.name)
        if value is not None:
            return value, f"the name {named.name!r} ({'un' if value else ''}cased)"
    return None, None


def cased_tokens(vocab: Iterable[str]) -> list[str]:
    """The tokens with capital letters, specials ([CLS], [unused0], ...) left out: none in a
    vocabulary learned from lower-cased text; lower-cased input can never produce them."""
    return [t for t in vocab if not SPECIAL_TOKEN.match(t) and t != t.lower()]


def resolve_lower_case(explicit: bool | None, checkpoint=None, vocab: Iterable[str] | None = None,
                       log: Callable[[str], None] = print,
                       warn: Callable[[str], None] | None = None) -> bool:
    """The casing to use: `explicit` if given, else the checkpoint's, else uncased.

    An explicit value that contradicts the checkpoint's recorded casing is used, with a warning.
    With nothing recorded, a vocabulary holding capitalised pieces draws a warning: lower-cased
    text never reaches them, so it is most likely cased (pass lower_case=False).
    """
    warn = warn or log
    recorded, where = checkpoint_lower_case(checkpoint) if checkpoint is not None else (None, None)
    if explicit is not None:
        if recorded is not None and recorded != explicit:
            warn(f"lower_case={explicit} as given, but {where} records lower_case={recorded}: "
                 "the text is normalised unlike the vocabulary's pretraining text")
        else:
            log(f"lower_case={explicit} (as given)")
        return bool(explicit)
    if recorded is not None:
        log(f"lower_case={recorded} from {where}")
        return recorded
    capitals = cased_tokens(vocab or ())
    if capitals:
        warn(f"lower_case=True by default (nothing records the casing), but the vocabulary has "
             f"{len(capitals)} pieces with capitals (e.g. {capitals[:3]}) that lower-cased text "
             "never reaches: for a cased vocabulary pass --nolower_case")
    else:
        log("lower_case=True: nothing records the casing, so uncased as the authors' released "
            "models; --nolower_case for a cased vocabulary")
    return True
