"""The local LoRA learner and the trainer around it, for any provider that trains in-process.

:mod:`.loading` loads the model with its adapter (``[model.local]``) and makes the learner;
:mod:`.learner` (log-probs, loss, backward, AdamW in a worker thread) with
:mod:`.chunked_logprobs`, :mod:`.shared_prefix`, :mod:`.reference` and :mod:`.llds`;
:mod:`.fsdp` and :mod:`.sharded_learner` under torchrun; :mod:`.state` (checkpoints);
:mod:`.trainer` (the Trainer, with a publish step for the sampler's weights). Importing this
package is cheap: torch loads with its modules.
"""
