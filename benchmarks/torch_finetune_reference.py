"""The Hugging Face PyTorch ELECTRA fine-tuning step, as a timing reference for
`benchmarks/benchmark_finetune_step.py` (a `benchmarks.row_worker` child: `python -m
benchmarks.torch_finetune_reference WORKDIR`).

`ElectraForSequenceClassification` with the sizes of our `ElectraConfig` (`torch_reference.hf_config`),
train mode (dropout on), on the very batches our rows use (padding included, attention masked),
cross-entropy over the batch, `torch.optim.AdamW(lr=1e-4, weight_decay=0.01)`:
zero_grad(set_to_none=True), backward, step. fp32, torch's intra-op threads = the machine's cores.

Differences from electra-finetune's step that change the work a little:
  - HF's classification head is dense(H, H) + GELU + dropout + dense(H, labels) on [CLS]; the
    authors' (ours) is dropout + dense(H, labels): one more H x H product per example in HF.
  - Ours is AdamWeightDecay with layer-wise learning-rate decay and a global-norm clip at 1.0
    (one more pass over the gradients); the reference is plain AdamW at a constant rate.
"""

from __future__ import annotations

import itertools
import os

LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01


class TorchFinetuneStep:
    """One HF PyTorch fine-tuning step per call, cycling over fixed batches; `info` for the header."""

    def __init__(self, model_config, batches, num_labels: int = 2, threads: int | None = None,
                 seed: int = 0):
        import numpy as np
        import torch
        import transformers
        from transformers import ElectraForSequenceClassification

        from benchmarks.torch_reference import hf_config

        torch.set_num_threads(threads or os.cpu_count() or 1)
        torch.manual_seed(seed)
        self.model = ElectraForSequenceClassification._from_config(
            hf_config(model_config, num_labels=num_labels)).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LEARNING_RATE,
                                           weight_decay=WEIGHT_DECAY)

        def to_torch(value):
            return torch.from_numpy(np.ascontiguousarray(value, dtype=np.int64))

        self._cycle = itertools.cycle([
            (to_torch(b["input_ids"]), to_torch(b["input_mask"]), to_torch(b["segment_ids"]),
             to_torch(b["label"])) for b in batches])
        self.info = {"torch": torch.__version__, "transformers": transformers.__version__,
                     "threads": torch.get_num_threads(),
                     "attn_implementation": self.model.config._attn_implementation,
                     "parameters": sum(p.numel() for p in self.model.parameters())}

    def __call__(self) -> float:
        input_ids, input_mask, segment_ids, labels = next(self._cycle)
        loss = self.model(input_ids=input_ids, attention_mask=input_mask,
                          token_type_ids=segment_ids, labels=labels).loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def _serve(workdir: str) -> None:
    from benchmarks import row_worker

    model_config, batches, setup = row_worker.load_inputs(workdir)
    step = TorchFinetuneStep(model_config, batches, threads=setup.get("torch_threads"))
    row_worker.serve(step, 1, step.info)


if __name__ == "__main__":
    import sys

    _serve(sys.argv[1])
