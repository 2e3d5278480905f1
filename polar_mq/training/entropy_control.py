"""An entropy bonus whose coefficient steers the policy's sampling entropy toward a target.

A fixed coefficient has no safe value here: the learner's optimizer (AdamW) takes a step of about
the learning rate whatever the gradient's size, so on a step whose groups all lack reward variance
the bonus alone moves the weights by a full step. Too small a coefficient and the policy still
narrows to one reply per task (no variance, no GRPO signal); a larger one feeds on itself: wider
sampling gives wrong, flat groups, whose steps are then the bonus alone, until the replies are
noise (docs/training.md has both runs).

So the coefficient is a controller's output, as the temperature of soft actor-critic is: after
each step it moves by `gain` times the gap between `target` and the entropy the step measured,
kept within `[0, max_coef]`. Above the target the bonus fades to nothing and GRPO alone acts;
below it, the bonus grows until the sampling widens again.

Below the target the coefficient is at least `min_coef`: the untrained policy samples far above
any useful target, so the coefficient falls to 0 within a few steps, and climbing back from 0 at
`gain` per nat per step once the policy narrows takes tens of steps, by which time it has
narrowed to one reply per task. The floor does not hold above the target: there the bonus must be
free to fade to nothing, because on a step whose groups are all flat it is the whole gradient,
which AdamW turns into a full step whatever the coefficient (docs/training.md has a run whose
entropy a floor held at all times drove from 2.6 to 9.8 nats).
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
    """The smallest coefficient once the entropy is below the target (module docstring)."""
    coef: float = 0.0
    """The coefficient the next step uses."""

    def __post_init__(self) -> None:
        if self.target <= 0 or self.gain <= 0 or self.max_coef <= 0:
            raise ValueError("target, gain and max_coef must be positive")
        if not 0 <= self.min_coef <= self.max_coef:
            raise ValueError("min_coef must be within [0, max_coef]")
        self.coef = min(self.max_coef, max(0.0, self.coef))

    def update(self, entropy: float | None) -> float:
        """Move the coefficient after a step that measured `entropy` (None: it scored no
        token, and the coefficient stays); the coefficient for the next step."""
        if entropy is not None:
            moved = self.coef + self.gain * (self.target - entropy)
            if entropy < self.target:
                moved = max(moved, self.min_coef)
            self.coef = min(self.max_coef, max(0.0, moved))
        return self.coef
