"""Loss and gradient-norm anomalies: detect, decide, and refuse to loop.

:meth:`AnomalyDetector.check` runs once per step, after the backward pass and before
the optimizer step. A step is anomalous when its loss or gradient norm is not finite,
or when its loss (optionally its gradient norm) exceeds ``spike_factor`` times the
rolling median of the last ``window`` good steps. The policy decides what happens:

* ``skip``: do not apply this step's update; carry on with the next batch.
* ``rollback``: restore the last good checkpoint and skip the offending batch.

Neither may loop forever: a rollback at a step that has already been rolled back
``max_rollbacks_per_step`` times, or more than ``max_consecutive_skips`` skipped steps
in a row, raise :class:`RepeatedAnomalyError`, whose exit code is
:data:`~ftfleet.contract.EXIT_UNRECOVERABLE`.

Only good steps enter the rolling history, so a spike never raises its own baseline.
The detector that made a rollback decision must survive the rollback (keep the object;
do not restore it from the checkpoint), or the rollback count would be rolled back too.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import math
import statistics
from typing import Any

from ftfleet.contract import EXIT_UNRECOVERABLE
from ftfleet.errors import ConfigError, UserError

log = logging.getLogger(__name__)

POLICIES = ("skip", "rollback")


class RepeatedAnomalyError(UserError):
    """The same failure keeps coming back; restarting will not help."""

    exit_code = EXIT_UNRECOVERABLE


#: Where the trainer config nests this block (ResilienceConfig), for error messages.
_KEY = "resilience.anomaly"


@dataclasses.dataclass(kw_only=True, slots=True)
class AnomalyConfig:
    """What counts as an anomalous step and what to do about it."""

    policy: str = "skip"
    """``skip`` the step's update, or ``rollback`` to the last good checkpoint and skip the
    offending batch."""
    spike_factor: float = 5.0
    """A loss above this multiple of the rolling median is a spike. 0 disables spike
    detection (non-finite values are always anomalies)."""
    grad_norm_spike_factor: float = 0.0
    """Same for the gradient norm. 0 (default) disables it: early gradient norms vary by
    orders of magnitude."""
    window: int = 100
    """Number of recent good steps the median is taken over."""
    min_history: int = 20
    """Good steps needed before spikes are judged at all."""
    max_rollbacks_per_step: int = 2
    """Rollbacks allowed at one step before the run stops."""
    max_consecutive_skips: int = 25
    """Skipped steps allowed in a row before the run stops."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"{_KEY}.policy={self.policy!r}: use skip or rollback")
        for name in ("spike_factor", "grad_norm_spike_factor"):
            value = getattr(self, name)
            if not (value == 0 or value > 1):
                raise ConfigError(f"{_KEY}.{name}={value!r}: use a factor above 1, or 0 to disable")
        if self.window < 3:
            raise ConfigError(f"{_KEY}.window={self.window}: use at least 3 steps")
        if not 1 <= self.min_history <= self.window:
            raise ConfigError(f"{_KEY}.min_history={self.min_history}: use 1 to {_KEY}.window ({self.window})")
        if self.max_rollbacks_per_step < 1:
            raise ConfigError(f"{_KEY}.max_rollbacks_per_step={self.max_rollbacks_per_step}: use 1 or more")
        if self.max_consecutive_skips < 1:
            raise ConfigError(f"{_KEY}.max_consecutive_skips={self.max_consecutive_skips}: use 1 or more")


class Action(enum.StrEnum):
    OK = "ok"
    SKIP = "skip"
    ROLLBACK = "rollback"


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    step: int
    #: Empty when OK; otherwise what was wrong, for the log.
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.action is Action.OK


@dataclasses.dataclass(slots=True)
class AnomalyCounters:
    nonfinite: int = 0
    spikes: int = 0
    skipped: int = 0
    rollbacks: int = 0


class AnomalyDetector:
    def __init__(self, config: AnomalyConfig | None = None) -> None:
        self.config = config or AnomalyConfig()
        self.counters = AnomalyCounters()
        self._loss: collections.deque[float] = collections.deque(maxlen=self.config.window)
        self._grad: collections.deque[float] = collections.deque(maxlen=self.config.window)
        self._rollbacks_at: collections.Counter[int] = collections.Counter()
        self._consecutive_skips = 0

    def check(self, step: int, loss: Any, grad_norm: Any = None) -> Decision:
        """Judge one step. ``loss`` and ``grad_norm`` are numbers or 0-d tensors
        (``float()`` is applied); ``grad_norm`` may be None when it is not computed."""
        loss_v = float(loss)
        grad_v = None if grad_norm is None else float(grad_norm)
        reason = self._reason(loss_v, grad_v)
        if not reason:
            self._consecutive_skips = 0
            self._loss.append(loss_v)
            if grad_v is not None:
                self._grad.append(grad_v)
            return Decision(Action.OK, step)
        if self.config.policy == "rollback":
            return self._rollback(step, reason)
        return self._skip(step, reason)

    def _reason(self, loss: float, grad: float | None) -> str:
        cfg = self.config
        if not math.isfinite(loss) or (grad is not None and not math.isfinite(grad)):
            self.counters.nonfinite += 1
            return f"non-finite loss={loss} grad_norm={grad}"
        for name, value, history, factor in (
            ("loss", loss, self._loss, cfg.spike_factor),
            ("grad_norm", grad, self._grad, cfg.grad_norm_spike_factor),
        ):
            if value is None or not factor or len(history) < cfg.min_history:
                continue
            median = statistics.median(history)
            if median > 0 and value > factor * median:
                self.counters.spikes += 1
                return (
                    f"{name}={value:.6g} is {value / median:.1f}x the rolling median "
                    f"{median:.6g} of the last {len(history)} good steps "
                    f"(limit {factor:g}x)"
                )
        return ""

    def _skip(self, step: int, reason: str) -> Decision:
        self._consecutive_skips += 1
        self.counters.skipped += 1
        if self._consecutive_skips > self.config.max_consecutive_skips:
            raise RepeatedAnomalyError(
                f"{self._consecutive_skips} anomalous steps in a row, the last at step "
                f"{step}: {reason}. Skipping does not help; lower the learning rate, "
                "check the data at these steps, or resume from an earlier checkpoint."
            )
        log.warning("step %d skipped: %s", step, reason)
        return Decision(Action.SKIP, step, reason)

    def _rollback(self, step: int, reason: str) -> Decision:
        self._rollbacks_at[step] += 1
        count = self._rollbacks_at[step]
        if count > self.config.max_rollbacks_per_step:
            raise RepeatedAnomalyError(
                f"step {step} is anomalous again after {count - 1} rollbacks: {reason}. "
                "Rolling back again would loop; lower the learning rate, check the "
                "data around this step, or resume from an earlier checkpoint."
            )
        self.counters.rollbacks += 1
        log.warning(
            "step %d: %s; rolling back to the last good checkpoint (rollback %d of %d at this step)",
            step,
            reason,
            count,
            self.config.max_rollbacks_per_step,
        )
        return Decision(Action.ROLLBACK, step, reason)

    # -- persistence across restarts (not across rollbacks: see the module doc) ----

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss": list(self._loss),
            "grad": list(self._grad),
            "rollbacks_at": dict(self._rollbacks_at),
            "counters": dataclasses.asdict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loss.clear()
        self._loss.extend(float(v) for v in state.get("loss", []))
        self._grad.clear()
        self._grad.extend(float(v) for v in state.get("grad", []))
        self._rollbacks_at = collections.Counter({int(k): int(v) for k, v in state.get("rollbacks_at", {}).items()})
        self.counters = AnomalyCounters(**state.get("counters", {}))
