"""How often to checkpoint: Young's and Daly's optimum, fed with measured costs.

With a checkpoint that costs ``C`` seconds of training time and interruptions every
``M`` seconds on average (the whole job's MTBF: any node's interruption stops every
rank), the expected loss per unit of time is minimised at

* Young (1974): ``T = sqrt(2 C M)``
* Daly (2006), higher order: ``T = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C``
  for ``C < 2M``, else ``T = M``

``T`` is compute time between the ends of two checkpoints. :class:`AdaptiveInterval`
estimates the inputs while the run goes:

* ``C`` = EWMA of the time each save blocked training + ``k`` x EWMA of its background
  (persist) time, since a background save also slows training down: it competes for
  host CPUs, memory bandwidth and the PCIe bus. ``k`` is measured: the median time of
  the steps that ran while a save was in flight over the median of the steps that did
  not, minus one (``record_step``). On a GPU host with spare cores it is near 0; on a
  2-core CPU box it is large. ``persist_overhead`` pins ``k`` instead.
* ``M`` = ``(observed run time + mtbf_s) / (interruptions + 1)``: the configured MTBF
  counts as one prior interruption, and each notice or restart recorded in the run
  moves the estimate towards what the run has actually seen. With
  ``mtbf_source="config"``, ``M = mtbf_s`` (e.g. fed from the fleet's metrics).

The result is never below the time one save needs end to end (blocked + persist),
since only one save may be in flight.

With ``checkpoint.async_save=auto`` both ways of saving are measured, each with its own
averages: in the background (``async``: blocked for the copy, then a persist that slows
the steps beside it) and in the foreground (``sync``: blocked for the whole write, then
the commit). :meth:`AdaptiveInterval.choose_mode` takes the one of lower ``C`` and
measures the other again every :data:`PROBE_EVERY` saves; the interval is planned for
the cheaper one. On a GPU host the background save is nearly free; on a host with few
cores per rank it can cost training more than blocking does (docs/RESILIENCE.md).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ftfleet.errors import ConfigError

MODES = ("adaptive", "fixed")
#: Step times kept for the overhead estimate, of each kind.
STEP_SAMPLES = 64
#: Steps of each kind needed before the overhead counts as measured.
MIN_QUIET, MIN_BUSY = 3, 2
MTBF_SOURCES = ("observed", "config")
#: The ways of saving: in the background (dcp.async_save) or blocking (dcp.save).
SAVE_MODES = ("async", "sync")
#: With both modes, the dearer one is measured again after this many saves.
PROBE_EVERY = 8


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``."""
    _check_inputs(cost_s, mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum; ``M`` when the checkpoint costs ``2M`` or more."""
    _check_inputs(cost_s, mtbf_s)
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def daly_goodput(interval_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's (2006) model under exponential failures of mean ``mtbf_s``: a save costing
    ``cost_s`` after every ``interval_s`` seconds of work, ``restart_s`` lost per failure
    before work resumes. Expected wall time per second of work is
    ``M e^(R/M) (e^((tau + C)/M) - 1) / tau``; goodput is its inverse. Its maximum is
    near :func:`daly_interval`."""
    if not (interval_s > 0 and cost_s >= 0 and restart_s >= 0 and mtbf_s > 0):
        raise ValueError("interval and MTBF must be > 0, save and restart costs >= 0")
    m = mtbf_s
    return interval_s / (m * math.exp(restart_s / m) * math.expm1((interval_s + cost_s) / m))


def _check_inputs(cost_s: float, mtbf_s: float) -> None:
    if not (cost_s >= 0 and math.isfinite(cost_s)):
        raise ValueError(f"checkpoint cost {cost_s!r}: use a finite number of seconds >= 0")
    if not (mtbf_s > 0 and math.isfinite(mtbf_s)):
        raise ValueError(f"MTBF {mtbf_s!r}: use a finite number of seconds > 0")


#: Where the trainer config nests this block (ResilienceConfig), for error messages.
_KEY = "resilience.interval"


@dataclasses.dataclass(kw_only=True, slots=True)
class IntervalConfig:
    """How the checkpoint interval is chosen."""

    mode: str = "adaptive"
    """``adaptive``: Daly's optimum from measured costs; ``fixed``: every fixed_steps."""
    fixed_steps: int = 500
    """The interval in fixed mode. In adaptive mode the run's first save comes as soon as
    the step time is measured (about 5 steps in), or at fixed_steps if that is sooner,
    and fixed_steps is the interval only until a save's cost is measured."""
    mtbf_s: float = 4 * 3600.0
    """The whole job's mean time between interruptions, seconds (prior, or the value itself
    with mtbf_source=config). A node MTBF divided by the number of nodes."""
    mtbf_source: str = "observed"
    """``observed``: blend mtbf_s with the interruptions recorded in the run; ``config``: use
    mtbf_s as is."""
    ewma_alpha: float = 0.3
    """Weight of the newest save in the cost averages (0 < alpha <= 1)."""
    persist_overhead: float | None = None
    """Fraction of the background persist time that training loses to it; null (the
    default): measured from the step times with and without a save in flight."""
    memory_share: float = 0.0
    """With in-memory snapshots (checkpoint.memory): the share of failures, 0 to below 1,
    that a snapshot recovers (a process lost, a node lost while the peer holding its copy
    lives, a notice turned into an emergency checkpoint). The durable interval is planned
    for the rest, M / (1 - share); the snapshot interval for every failure, M. A two-level
    plan: frequent cheap snapshots, rare disk checkpoints. 0: every failure needs the disk."""
    notice_share: float = 0.0
    """With in-memory snapshots: the share of failures, 0 to below 1, that come with a
    notice long enough for an emergency checkpoint (a spot interruption notice: they lose
    no work), from the fleet's metrics like ``mtbf_s``. The snapshot interval is planned
    for the others, M / (1 - share): a SIGKILL, a crash, a node lost without notice.
    0: every failure loses the work since the last snapshot."""
    snapshot_fixed_steps: int = 10
    """In-memory snapshots (checkpoint.memory): every this many steps in fixed mode, and in
    adaptive mode until one has been measured. Adaptive: Daly's optimum for the snapshot's
    own cost (the time it blocks training) and the same MTBF."""
    min_steps: int = 1
    """Bounds on the interval in steps; max_steps 0: no upper bound. The floor of one save's
    duration wins over max_steps."""
    max_steps: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"{_KEY}.mode={self.mode!r}: use adaptive or fixed")
        if self.mtbf_source not in MTBF_SOURCES:
            raise ConfigError(f"{_KEY}.mtbf_source={self.mtbf_source!r}: use observed or config")
        if self.fixed_steps < 1:
            raise ConfigError(f"{_KEY}.fixed_steps={self.fixed_steps}: use 1 or more")
        if not (self.mtbf_s > 0 and math.isfinite(self.mtbf_s)):
            raise ConfigError(
                f"{_KEY}.mtbf_s={self.mtbf_s!r}: use a positive number "
                "of seconds (the job's mean time between interruptions)"
            )
        if not 0 < self.ewma_alpha <= 1:
            raise ConfigError(f"{_KEY}.ewma_alpha={self.ewma_alpha}: use 0 < alpha <= 1")
        if self.persist_overhead is not None and not 0 <= self.persist_overhead <= 1:
            raise ConfigError(
                f"{_KEY}.persist_overhead={self.persist_overhead}: use a fraction from 0 to 1, or null to measure it"
            )
        if not 0 <= self.memory_share < 1:
            raise ConfigError(
                f"{_KEY}.memory_share={self.memory_share}: use a fraction from 0 to below 1 "
                "(the share of failures in-memory snapshots recover)"
            )
        if not 0 <= self.notice_share < 1:
            raise ConfigError(
                f"{_KEY}.notice_share={self.notice_share}: use a fraction from 0 to below 1 "
                "(the share of failures that come with a notice)"
            )
        if self.snapshot_fixed_steps < 1:
            raise ConfigError(f"{_KEY}.snapshot_fixed_steps={self.snapshot_fixed_steps}: use 1 or more")
        if self.min_steps < 1:
            raise ConfigError(f"{_KEY}.min_steps={self.min_steps}: use 1 or more")
        if self.max_steps and self.max_steps < self.min_steps:
            raise ConfigError(
                f"{_KEY}.max_steps={self.max_steps}: use 0 (no bound) or at least min_steps ({self.min_steps})"
            )


@dataclasses.dataclass
class SaveCost:
    """EWMAs of one save mode's durations, and how many saves fed them."""

    blocked_s: float | None = None
    persist_s: float | None = None
    saves: int = 0
    #: The run's save count at this mode's newest sample (when to measure it again).
    last_sample: int = 0


class AdaptiveInterval:
    """Chooses the checkpoint interval; see the module doc for the model.

    ``elapsed_s`` and ``interruptions`` carry the run's history over a restart (see
    :meth:`state_dict`); ``clock`` is injectable for tests. ``modes``: the save modes the
    run may use (:data:`SAVE_MODES`), the configured one first; two: it chooses.
    """

    def __init__(
        self,
        config: IntervalConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        modes: tuple[str, ...] = ("async",),
    ) -> None:
        if not modes or any(m not in SAVE_MODES for m in modes) or len(set(modes)) != len(modes):
            raise ValueError(f"modes={modes!r}: one or both of {SAVE_MODES}")
        self.config = config or IntervalConfig()
        self._clock = clock
        self._started = clock()
        self._elapsed_before = 0.0
        self._interruptions = 0
        self.last_interruption_at: float | None = None
        self.modes = modes
        self.costs = {m: SaveCost() for m in modes}
        #: EWMA of what an in-memory snapshot costs training (blocked + the slowdown of
        #: the steps its background part overlapped), and their count.
        self.snapshot_s: float | None = None
        #: EWMA of a snapshot's duration end to end (blocked + background).
        self.snapshot_busy_s: float | None = None
        self.snapshots = 0
        #: The only sample so far was provisional (see :meth:`record_snapshot`).
        self.snapshot_provisional = False
        # Recent step times, without and with a save in flight (not checkpointed: a
        # restarted process measures its own machine again).
        self._quiet: deque[float] = deque(maxlen=STEP_SAMPLES)
        #: By save mode: a blocking save's background part is only its commit, whose
        #: steps would make a background write look free.
        self._busy: dict[str, deque[float]] = {m: deque(maxlen=STEP_SAMPLES) for m in modes}

    # -- inputs ------------------------------------------------------------------

    def record_save(self, blocked_s: float, persist_s: float, mode: str | None = None) -> None:
        """One save in ``mode`` (default: the configured one): seconds training was
        blocked, then seconds until it was committed in the background."""
        if not (blocked_s >= 0 and persist_s >= 0):
            raise ValueError(f"save durations must be >= 0 (blocked={blocked_s!r}, persist={persist_s!r})")
        cost = self.costs[self._mode(mode)]
        cost.blocked_s = self._ewma(cost.blocked_s, blocked_s)
        cost.persist_s = self._ewma(cost.persist_s, persist_s)
        cost.saves += 1
        cost.last_sample = self.saves

    def _mode(self, mode: str | None) -> str:
        """``mode`` if the run uses it, else the configured one."""
        return mode if mode in self.costs else self.modes[0]

    @property
    def saves(self) -> int:
        """Saves measured, in every mode."""
        return sum(c.saves for c in self.costs.values())

    @property
    def blocked_s(self) -> float | None:
        """The chosen mode's EWMA of the time a save blocked training."""
        return self.costs[self.best_mode()].blocked_s

    @property
    def persist_s(self) -> float | None:
        """The chosen mode's EWMA of the time from a save's return to its commit."""
        return self.costs[self.best_mode()].persist_s

    def record_snapshot(
        self, blocked_s: float, slowdown_s: float = 0.0, background_s: float = 0.0, provisional: bool = False
    ) -> None:
        """One in-memory snapshot: seconds it blocked training (the copy of the state),
        the extra seconds of the steps its background part overlapped (their time over
        the median quiet step), and how long that background part took.

        ``provisional``: a sample without that comparison (a run's first snapshot, before
        a quiet step was measured: its whole background part counts, and it pays for the
        process's new memory and files). As the only sample it plans the interval until
        the next one, which replaces it instead of being averaged with it: a first
        snapshot costs many times a later one, and averaged in it would keep the
        estimate, and so the interval, off for several snapshots."""
        if not (blocked_s >= 0 and slowdown_s >= 0 and background_s >= 0):
            raise ValueError(
                f"snapshot durations must be >= 0 (blocked={blocked_s!r}, slowdown={slowdown_s!r}, "
                f"background={background_s!r})"
            )
        if self.snapshot_provisional:  # a stand-in until now: replaced
            self.snapshot_s, self.snapshot_busy_s, self.snapshots = None, None, 0
        self.snapshot_s = self._ewma(self.snapshot_s, blocked_s + slowdown_s)
        self.snapshot_busy_s = self._ewma(self.snapshot_busy_s, blocked_s + background_s)
        self.snapshots += 1
        self.snapshot_provisional = provisional and self.snapshots == 1

    def _ewma(self, average: float | None, sample: float) -> float:
        a = self.config.ewma_alpha
        return sample if average is None else a * sample + (1 - a) * average

    def record_step(
        self, seconds: float, during_save: bool, during_snapshot: bool = False, mode: str | None = None
    ) -> None:
        """One training step's duration, and whether the background part of a save (in
        ``mode``, default the configured one) or of an in-memory snapshot was in flight
        during it."""
        if seconds > 0 and math.isfinite(seconds):
            if during_save:
                self._busy[self._mode(mode)].append(seconds)
            elif not during_snapshot:
                self._quiet.append(seconds)

    def quiet_step_s(self) -> float | None:
        """The median step with nothing in flight; None before enough were measured."""
        return statistics.median(self._quiet) if len(self._quiet) >= MIN_QUIET else None

    def overhead(self, mode: str | None = None) -> tuple[float, str]:
        """``k``: the fraction of a save's persist time (in ``mode``, default the
        configured one) that training loses."""
        pinned = self.config.persist_overhead
        if pinned is not None:
            return pinned, f"{pinned:g} (configured)"
        steps = self._busy[self._mode(mode)]
        if len(self._quiet) < MIN_QUIET or len(steps) < MIN_BUSY:
            return 1.0, "1 (not measured yet)"
        quiet, busy = statistics.median(self._quiet), statistics.median(steps)
        k = min(1.0, max(0.0, busy / quiet - 1.0))
        return k, f"{k:.2f} (measured: steps {busy:.3f}s during a save, {quiet:.3f}s without)"

    def record_interruption(self, t: float | None = None) -> None:
        """A notice or a restart happened, at epoch ``t`` (default: now)."""
        self._interruptions += 1
        self.last_interruption_at = time.time() if t is None else t

    # -- estimates ---------------------------------------------------------------

    def run_time_s(self) -> float:
        return self._elapsed_before + (self._clock() - self._started)

    def mtbf(self) -> tuple[float, str]:
        cfg = self.config
        if cfg.mtbf_source == "config":
            return cfg.mtbf_s, f"M={cfg.mtbf_s:.0f}s (configured)"
        n, observed = self._interruptions, self.run_time_s()
        m = (observed + cfg.mtbf_s) / (n + 1)
        return m, (f"M={m:.0f}s ({n} interruptions in {observed / 3600:.2f}h observed, prior {cfg.mtbf_s:.0f}s)")

    def durable_mtbf(self) -> tuple[float, str]:
        """The MTBF the durable interval is planned for: :meth:`mtbf` over the share of
        failures the in-memory snapshots do not recover (``memory_share``)."""
        return self._mtbf_of_rest(self.config.memory_share, "need the disk")

    def snapshot_mtbf(self) -> tuple[float, str]:
        """The MTBF the snapshot interval is planned for: :meth:`mtbf` over the share of
        failures that come without a notice (``notice_share``)."""
        return self._mtbf_of_rest(self.config.notice_share, "without a notice")

    def _mtbf_of_rest(self, share: float, what: str) -> tuple[float, str]:
        """:meth:`mtbf` of the failures left when ``share`` of them are set aside."""
        m, why = self.mtbf()
        if not share:
            return m, why
        return m / (1 - share), f"{why}, {1 - share:.0%} of them {what}: M={m / (1 - share):.0f}s"

    def cost(self, mode: str | None = None) -> tuple[float, str] | None:
        """``C`` of ``mode`` (default: the cheaper one measured) and why; None before a
        save in it was measured."""
        mode = mode or self.best_mode()
        cost = self.costs[mode]
        if cost.blocked_s is None or cost.persist_s is None:
            return None
        k, k_why = self.overhead(mode)
        c = cost.blocked_s + k * cost.persist_s
        what = f"{mode} save: " if len(self.modes) > 1 else ""
        return c, (
            f"C={c:.2f}s ({what}blocked {cost.blocked_s:.2f}s + k x persist "
            f"{cost.persist_s:.2f}s, k={k_why}, EWMA of {cost.saves} saves)"
        )

    def best_mode(self) -> str:
        """The measured mode of lowest ``C``; the configured one while none is."""
        measured = [(c[0], m) for m in self.modes if (c := self.cost(m)) is not None]
        return min(measured)[1] if measured else self.modes[0]

    def choose_mode(self) -> tuple[str, str]:
        """The mode of the next save, and why: one never measured first, then the one of
        lower ``C``, except that the other is measured again every :data:`PROBE_EVERY`
        saves (the machine's load changes what a background save costs)."""
        if len(self.modes) == 1:
            return self.modes[0], f"{self.modes[0]} (configured)"
        unmeasured = [m for m in self.modes if self.cost(m) is None]
        if unmeasured:
            return unmeasured[0], f"auto: measuring a {unmeasured[0]} save"
        best = self.best_mode()
        (other,) = [m for m in self.modes if m != best]
        if self.saves - self.costs[other].last_sample >= PROBE_EVERY:
            return other, f"auto: measuring a {other} save again ({PROBE_EVERY} saves since the last)"
        c_best, c_other = self.cost(best)[0], self.cost(other)[0]  # type: ignore[index]
        return best, f"auto: {best} C={c_best:.2f}s < {other} C={c_other:.2f}s"

    # -- outputs -----------------------------------------------------------------

    def interval_s(self) -> tuple[float | None, str]:
        """The optimal interval in seconds and why; None in fixed mode or before the
        first save is measured."""
        if self.config.mode == "fixed":
            return None, f"fixed: every {self.config.fixed_steps} steps (interval.mode=fixed)"
        cost = self.cost()
        if cost is None:
            return None, (f"adaptive: no save measured yet, every {self.config.fixed_steps} steps until one is")
        (c, c_why), (m, m_why) = cost, self.durable_mtbf()
        t = daly_interval(c, m)
        why = f"Daly: {c_why}, {m_why} -> T={t:.1f}s"
        floor = self.blocked_s + self.persist_s  # type: ignore[operator]
        if t < floor:
            t, why = floor, why + f", raised to one save's duration {floor:.1f}s"
        return t, why

    def interval_steps(self, step_time_s: float) -> tuple[int, str]:
        """The interval in steps of ``step_time_s`` seconds, and a line for the log."""
        if not step_time_s > 0:
            raise ValueError(f"step_time_s={step_time_s!r}: use the measured seconds per step (> 0)")
        cfg = self.config
        seconds, why = self.interval_s()
        if seconds is None:
            return cfg.fixed_steps, why
        # Rounding to whole steps must not undercut one save's duration.
        one_save = self.blocked_s + self.persist_s  # type: ignore[operator]
        floor_steps = math.ceil(one_save / step_time_s - 1e-9)
        steps = max(cfg.min_steps, floor_steps, round(seconds / step_time_s))
        why += f" = {steps} steps at {step_time_s:.3f}s/step"
        if cfg.max_steps and steps > cfg.max_steps:
            capped = max(cfg.max_steps, floor_steps)
            if capped != steps:
                why += f", capped at {capped} (max_steps {cfg.max_steps}"
                why += ", but not below one save's duration)" if capped > cfg.max_steps else ")"
                steps = capped
        return steps, why

    def snapshot_interval_steps(self, step_time_s: float) -> tuple[int, str]:
        """The in-memory snapshot interval in steps of ``step_time_s`` seconds: Daly's
        optimum for the snapshot's cost and the MTBF of the failures without a notice
        (:meth:`snapshot_mtbf`; a snapshot is lost with its node only when the peer holding
        its copy goes too, which the disk tiers cover),
        never shorter than one snapshot end to end (one is in flight at a time)."""
        if not step_time_s > 0:
            raise ValueError(f"step_time_s={step_time_s!r}: use the measured seconds per step (> 0)")
        fixed = self.config.snapshot_fixed_steps
        if self.config.mode == "fixed":
            return fixed, f"fixed: every {fixed} steps (interval.mode=fixed)"
        if self.snapshot_s is None or self.snapshot_busy_s is None:
            return fixed, f"adaptive: no snapshot measured yet, every {fixed} steps until one is"
        c, (m, m_why) = self.snapshot_s, self.snapshot_mtbf()
        t = daly_interval(c, m)
        floor = math.ceil(self.snapshot_busy_s / step_time_s - 1e-9)
        steps = max(1, floor, round(t / step_time_s))
        why = (
            f"Daly: C={c:.4f}s (snapshot: blocked + slowdown, "
            + (
                "provisional: no quiet step to compare with"
                if self.snapshot_provisional
                else f"EWMA of {self.snapshots}"
            )
            + f"), {m_why} -> T={t:.1f}s"
            f" = {steps} steps at {step_time_s:.3f}s/step"
        )
        if steps == floor and floor > round(t / step_time_s):
            why += f", raised to one snapshot's duration {self.snapshot_busy_s:.2f}s"
        return steps, why

    # -- persistence -------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The history: the configured mode's costs as ``blocked_s``, ``persist_s``,
        ``saves``; the other mode's (``auto``) with the prefix ``other_``."""
        state = {
            "elapsed_s": self.run_time_s(),
            "interruptions": self._interruptions,
            "snapshot_s": self.snapshot_s,
            "snapshot_busy_s": self.snapshot_busy_s,
            "snapshots": self.snapshots,
            "snapshot_provisional": self.snapshot_provisional,
        }
        for prefix, mode in zip(("", "other_"), self.modes, strict=False):
            cost = self.costs[mode]
            state.update({f"{prefix}blocked_s": cost.blocked_s, f"{prefix}persist_s": cost.persist_s})
            state[f"{prefix}saves"] = cost.saves
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a run's history; the time since this object was built is added.
        Keys that are absent (an older checkpoint, another mode) keep the live values."""
        self._elapsed_before = float(state.get("elapsed_s", 0.0))
        self._interruptions = int(state.get("interruptions", 0))
        for prefix, mode in zip(("", "other_"), self.modes, strict=False):
            if f"{prefix}saves" in state:
                cost = self.costs[mode]
                cost.blocked_s = state.get(f"{prefix}blocked_s")
                cost.persist_s = state.get(f"{prefix}persist_s")
                cost.saves = int(state[f"{prefix}saves"])
        for cost in self.costs.values():
            cost.last_sample = self.saves
        if "snapshots" in state:  # older checkpoints lack the snapshots' costs: kept then
            self.snapshot_s = state.get("snapshot_s")
            self.snapshot_busy_s = state.get("snapshot_busy_s")
            self.snapshots = int(state["snapshots"])
            self.snapshot_provisional = bool(state.get("snapshot_provisional") or False)
