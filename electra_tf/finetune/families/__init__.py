"""Task families: one class per kind of fine-tuning task (`base.TaskFamily`), registered by name.

| family            | class                   | head (`heads.py`)          | examples           |
|-------------------|-------------------------|----------------------------|--------------------|
| `classification`  | `SentenceClassification`| `SentenceClassifier`       | `SentenceExample`  |
| `regression`      | `SentenceRegression`    | `SentenceRegressor`        | `SentenceExample`  |
| `tagging`         | `TokenTagging`          | `TokenTagger`              | `TaggingExample`   |
| `qa`              | `SpanQuestionAnswering` | `SpanQuestionAnswerer`     | `QAExample`        |
| `multiple_choice` | `MultipleChoice`        | `MultipleChoiceClassifier` | `ChoiceExample`    |

A new family is a `TaskFamily` subclass decorated with `@register_family` (and its head in
`heads.py`); `base.py` lists what it may override.

Example:
>>> family = get_family("classification")
>>> family.build_head(config, get_task("mrpc"), FinetuningConfig())   # a SentenceClassifier
"""

from electra_tf.finetune.families.base import (
    FAMILIES, Features, TaskFamily, get_family, register_family)
# Registered in this order (the order error messages list them in).
from electra_tf.finetune.families.sentence import SentenceClassification, SentenceRegression  # noqa: I001
from electra_tf.finetune.families.tagging import TokenTagging
from electra_tf.finetune.families.qa import SpanQuestionAnswering
from electra_tf.finetune.families.multiple_choice import MultipleChoice

__all__ = [
    "FAMILIES", "Features", "MultipleChoice", "SentenceClassification",
    "SentenceRegression", "SpanQuestionAnswering", "TaskFamily", "TokenTagging", "get_family",
    "register_family",
]
