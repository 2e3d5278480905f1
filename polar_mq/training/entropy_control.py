"""An entropy bonus whose coefficient steers the policy's sampling entropy toward a target.

A fixed coefficient has no safe value here: the learner's optimizer (AdamW) takes a step of about
the learning rate whatever the gradient's size, so on a step whose groups all lack reward variance
the bonus alone moves the weights by a full step. Too small a coefficient and the policy still
narrows to one reply per task (no variance, no GRPO signal); a larger one feeds on itself: wider
sampling gives wrong, flat groups, whose steps are then the bonus alone, until the replies are
noise (docs/training.md has both runs).

So the coefficient is a controller's output, as the temperature of soft actor-critic is: after
each step it moves by `gain` times the gap between `target` and the entropy the step measured,
kept within `[min_coef, max_coef]`. Above the target the bonus fades (to nothing with no floor)
and GRPO alone acts; below it, the bonus grows until the sampling widens again.

The floor is for the start: the untrained policy samples far above any useful target, so a
coefficient free to fall reaches 0 within a few steps and has to climb back from there, at `gain`
per nat per step, once the policy narrows; a floor keeps a bonus acting through the narrowing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EntropyController:
    target: float
    """Mean entropy (nats per loss-mask token) to hold the training rollouts' sampling at."""
    gain: float = 0.005
    """Coefficient change per step per nat of gap."""
    max_coef: float = 0.05
    min_coef: float = 0.0
    coef: float = 0.0
    """The coefficient the next step uses."""

    def __post_init__(self) -> None:
        if self.target <= 0 or self.gain <= 0 or self.max_coef <= 0:
            raise ValueError("target, gain and max_coef must be positive")
        if not 0 <= self.min_coef <= self.max_coef:
            raise ValueError("min_coef must be within [0, max_coef]")
        self.coef = self._bounded(self.coef)

    def _bounded(self, coef: float) -> float:
        return min(self.max_coef, max(self.min_coef, coef))

    def update(self, entropy: float | None) -> float:
        """Move the coefficient after a step that measured `entropy` (None: it scored no
        token, and the coefficient stays); the coefficient for the next step."""
        if entropy is not None:
            self.coef = self._bounded(self.coef + self.gain * (self.target - entropy))
        return self.coef
