"""Bridges from polar_mq's groups to the trainers people use: TRL, slime and verl.

Each trainer module (`trl`, `slime`, `verl`) turns the complete groups polar_mq hands out (the
results / group-lease shape, with trajectories) into that trainer's own types. They share one
reading of a group (`samples`): which samples train, how their token arrays line up, and which
reward and advantage they carry, so the three bridges cannot disagree on it.

The trainers' packages (torch, trl, verl, slime) are imported inside the functions that build
their objects, never at import time: `polar_mq.bridges` imports in the project's own
environment, which has none of them. Usage and what was tested where: docs/bridges.md.
"""

from polar_mq.bridges.samples import BridgeError, TrainingSample, training_samples

__all__ = ["BridgeError", "TrainingSample", "training_samples"]
