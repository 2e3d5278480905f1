"""A real GRPO trainer (PyTorch + peft LoRA) that consumes polar_mq's groups.

Two interpreters share the work, because torch lives in the vLLM virtualenv and not in the
project's (see docs/training.md):

- the project venv runs the loop (`loop.py`): it takes complete groups from the leased group
  stream, turns them into training samples with GRPO advantages (`grpo.py`), asks the learner for
  an optimizer step, publishes the saved adapter as the next policy version, then acks;
- the vLLM venv runs the learner (`learner.py`, a JSON-lines process spoken to through
  `learner_client.py`): the peft model, the logprob recomputation on the stored ids under the
  stored loss mask (`torch_ops.py`), the clipped importance-sampled loss, `save_pretrained`, and
  the reward-curve PNG (`plot.py`).

Only `learner.py`, `torch_ops.py` and `plot.py` import torch or matplotlib, and nothing that the
project venv imports imports them.
"""
