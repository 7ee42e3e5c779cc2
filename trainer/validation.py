"""Validation: a held-out set evaluated every ``validation.every`` steps on every rank,
and the best checkpoint by one of its metrics kept as a milestone.

What holds:

* **An evaluation does not change the run.** The factories are called with every RNG
  put back afterwards (a user's factory may draw from them). The model runs in eval mode under
  ``no_grad``; torch's CPU generator, the current CUDA device's, numpy's and Python's
  RNGs are seeded for the evaluation and afterwards as they were; the training reader is
  not touched (the set has a reader of its own, in the training process). A run with
  validation ends bit for bit where the same run without it ends, and its config hash
  is the same.
* **The same samples every time, on any world size.** The set is read as training data
  is, by global position, unshuffled: batch ``b`` of an evaluation is positions
  ``[b*B, (b+1)*B)``, rank ``r`` reading its ``r``-th slice (an IterableDataset is read
  from its start at each evaluation, as training would read it). A metric is the mean
  over the evaluation's samples: each rank's micro-batch means weighted by its samples,
  summed over the ranks in one collective.
* **Milestones live in the checkpoints.** An evaluation strictly better by
  ``validation.metric`` than every earlier one of the run (the best so far is part of
  the checkpoint, so a resumed run goes on comparing with it) makes its step a
  milestone: the step is saved at its end (the interval's save if it is due, else one
  more), and its manifest records the metric and the value. Retention keeps milestones
  by what the manifests say (trainer/checkpoint/retention.py), so nothing outside the
  tier decides what a bucket keeps.

Each evaluation is logged on rank 0, written to the event log (``validation``), exported
as ``ftfleet_validation{metric=...}``, and the last one and the best are in
``summary.json``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ftfleet.errors import ConfigError
from ftfleet.trainer.callbacks import Callback, StepInfo
from ftfleet.trainer.checkpoint.commit import Notes
from ftfleet.trainer.checkpoint.manifest import Milestone
from ftfleet.trainer.data.loader import GlobalBatches
from ftfleet.trainer.data.seeded import seed_of, seeded

if TYPE_CHECKING:
    from ftfleet.trainer.config import JobConfig
    from ftfleet.trainer.config_sections import ValidationConfig
    from ftfleet.trainer.events import EventLog
    from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog
    from ftfleet.trainer.resilience.interval.schedule import SaveSchedule
    from ftfleet.trainer.resilience.observability.metrics import Metrics
    from ftfleet.trainer.train import Run

log = logging.getLogger("ftfleet.validation")

#: The AppState extra that holds the best evaluation so far.
EXTRA = "validation"
#: An epoch training never reaches: keeps the evaluations' RNG seeds apart from the samples'.
_EPOCH = 2**32 - 1

MetricsFn = Callable[[torch.nn.Module, Any], Mapping[str, torch.Tensor]]


def loss_metrics(cfg: Any, job: JobConfig) -> MetricsFn:
    """``validation.metrics: loss``: the run's ``loss.factory`` loss, as ``loss``."""
    del cfg
    loss_fn = job.loss.factories["factory"](job=job)

    def metrics(model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        return {"loss": loss_fn(model, batch)}

    return metrics


class Best:
    """The best evaluation of the run so far, an AppState extra (the same on every rank:
    every value comes out of one all-reduce). A checkpoint without it (saved before
    validation was configured) leaves it empty: the next evaluation is then the best."""

    def __init__(self) -> None:
        self.value: float | None = None
        self.step: int | None = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        value = math.nan if self.value is None else self.value
        step = -1 if self.step is None else self.step
        return {"best": torch.tensor([value, float(step)], dtype=torch.float64)}

    def load_state_dict(self, sd: Mapping[str, torch.Tensor]) -> None:
        value, step = sd["best"].tolist()
        self.value = None if math.isnan(value) else value
        self.step = None if step < 0 else int(step)


class Validation(Callback):
    """The evaluations of a run (module doc). Collective: every rank evaluates the same
    batches at the same steps."""

    def __init__(
        self,
        run: Run,
        schedule: SaveSchedule | None = None,
        *,
        events: EventLog | None = None,
        metrics: Metrics | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        cfg: ValidationConfig = run.cfg.validation
        self.cfg = cfg
        self.schedule = schedule
        self.events = events
        self.exported = metrics
        self.watchdog = watchdog
        self.seed = run.cfg.seed
        world = run.env.world_size
        batch = cfg.batch_size or run.cfg.train.global_batch_size
        if batch % world:
            raise ConfigError(
                f"validation.batch_size={batch} is not divisible by the world size {world}: use a multiple of {world}"
            )
        # The RNGs are seeded for training already: what the factories draw must not move them.
        with _own_rngs(seed_of(self.seed, _EPOCH, 0), run.env.device):
            dataset = cfg.factories["factory"](job=run.cfg)
            measure = cfg.factories["metrics"](job=run.cfg)
        from ftfleet.trainer.train import check_dataset

        check_dataset(dataset, run.model, "validation.factory", cfg.factory)
        self.batches = _batches(cfg, dataset, batch)
        self.batch_size = batch
        self.reader = GlobalBatches(
            dataset, batch, run.env.rank, world, run.env.device, seed=run.cfg.seed, shuffle=False
        )
        self.measure: MetricsFn = measure
        if not callable(self.measure):
            raise ConfigError(
                f"validation.metrics returned {type(self.measure).__name__}: return a callable "
                "metrics(model, batch) -> {name: scalar tensor}"
            )
        self.best = Best()
        run.ckpt.app_state.extras[EXTRA] = self.best
        self.last: tuple[int, dict[str, float]] | None = None

    @classmethod
    def build(cls, run: Run, schedule: SaveSchedule | None = None, **kwargs: Any) -> Validation | None:
        """The run's validation, or None when ``validation.every`` is 0."""
        return cls(run, schedule, **kwargs) if run.cfg.validation.enabled else None

    # -- the loop's side ------------------------------------------------------------

    def on_step_end(self, run: Run, info: StepInfo) -> None:
        if info.step % self.cfg.every:
            return
        values = self.evaluate(run, info.step)
        self.last = (info.step, values)
        if self.cfg.metric not in values:
            raise ConfigError(
                f"validation.metric={self.cfg.metric!r} is not among what validation.metrics returns "
                f"({', '.join(sorted(values)) or 'nothing'}): name one of them"
            )
        value = values[self.cfg.metric]
        improved = math.isfinite(value) and (
            self.best.value is None or (value < self.best.value if self.cfg.mode == "min" else value > self.best.value)
        )
        if improved:
            self.best.value, self.best.step = value, info.step
        milestone = None
        if improved and self.cfg.milestones != "none":
            milestone = Milestone(self.cfg.metric, self.cfg.mode, value, self.cfg.milestones)
        run.ckpt.annotate(info.step, Notes(validation=values, milestone=milestone))
        if milestone is not None and self.schedule is not None:
            self.schedule.request(info.step, "milestone")
        if self.exported is not None:
            self.exported.validated(values)
        if run.env.is_rank0:
            shown = " ".join(f"{k} {v:.4f}" for k, v in sorted(values.items()))
            log.info("validation at step %d: %s%s", info.step, shown, " (best so far)" if improved else "")
        if self.events is not None:
            self.events.emit(
                "validation", step=info.step, metrics=values, best=improved, milestone=milestone is not None
            )

    def evaluate(self, run: Run, step: int) -> dict[str, float]:
        """The metrics of the set on the current weights. Collective."""
        model, device = run.model, run.env.device
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            # DDP's forward would broadcast rank 0's buffers into every rank's, which a
            # training forward does only at the next step: the module itself, then.
            model = model.module
        training = model.training
        names: list[str] | None = None
        sums: torch.Tensor | None = None
        with _own_rngs(seed_of(self.seed, _EPOCH, step), device), torch.no_grad():
            model.eval()
            try:
                for b in range(self.batches):
                    try:
                        batch, have = self.reader.get(b * self.batch_size, b), 1
                    except StopIteration:
                        batch, have = None, 0
                    if self.reader.iterable and dist.is_available() and dist.is_initialized():
                        # Each rank reads its own stream: they agree on its end, or the ranks
                        # with data would wait in the forward for one that has none.
                        flag = torch.tensor([have], device=device)
                        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                        have = int(flag.item())
                    if not have or batch is None:
                        raise ConfigError(
                            f"validation: validation.factory's set ran out after {b} of validation.batches="
                            f"{self.batches}: set validation.batches to at most {b}"
                        )
                    values = self.measure(model, batch.data)
                    names, row = _row(values, names, device)
                    count = _samples(batch.data, self.reader.micro_batch_size)
                    weighted = torch.cat([row * count, row.new_ones(1) * count])
                    sums = weighted if sums is None else sums + weighted
                    if self.watchdog is not None:
                        self.watchdog.beat(step)  # each batch is progress
            finally:
                model.train(training)
        assert sums is not None and names is not None  # at least one batch (_batches)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums)
        totals = sums.tolist()
        return {name: totals[i] / totals[-1] for i, name in enumerate(names)}

    def summary(self) -> dict[str, Any]:
        last = {"step": self.last[0], "metrics": self.last[1]} if self.last else None
        best = None
        if self.best.step is not None:
            best = {"step": self.best.step, "metric": self.cfg.metric, "value": self.best.value}
        return {"validation": last, "milestone": best}


@contextlib.contextmanager
def _own_rngs(seed: int, device: torch.device) -> Iterator[None]:
    """Run the block with every RNG of this rank (torch's CPU generator and the current
    CUDA device's, numpy's, Python's) seeded from ``seed``; afterwards each is as it was."""
    cuda = [torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), seeded(seed):
        if cuda:
            torch.cuda.manual_seed(seed)
        yield


def _batches(cfg: ValidationConfig, dataset: Any, batch: int) -> int:
    """Batches per evaluation: ``validation.batches``, or all the whole batches of a
    sized set; a set too small for them is refused."""
    length = None
    if not isinstance(dataset, torch.utils.data.IterableDataset) and hasattr(dataset, "__len__"):
        length = len(dataset)
    if cfg.batches == 0:
        if length is None:
            raise ConfigError(
                "validation.batches=0 reads the whole set, and validation.factory's set has no length: "
                "set validation.batches"
            )
        if length < batch:
            raise ConfigError(
                f"validation: the set has {length} samples, fewer than one batch of {batch}: "
                "set validation.batch_size lower"
            )
        return length // batch
    if length is not None and cfg.batches * batch > length:
        raise ConfigError(
            f"validation.batches={cfg.batches} of {batch} samples needs {cfg.batches * batch}, and the set has "
            f"{length}: use validation.batches={length // batch} or 0 (all of it)"
        )
    return cfg.batches


def _samples(data: Any, default: int) -> int:
    """Samples in a batch: the first dimension of its first tensor (an iterable set's last
    batch may be short), else ``default``."""
    if isinstance(data, torch.Tensor):
        return int(data.shape[0]) if data.dim() else default
    items = data.values() if isinstance(data, Mapping) else data if isinstance(data, list | tuple) else ()
    for item in items:
        found = _samples(item, -1)
        if found >= 0:
            return found
    return default


def _row(values: Any, names: list[str] | None, device: torch.device) -> tuple[list[str], torch.Tensor]:
    """One batch's metrics as a float64 row in ``names`` order (the first batch's names,
    sorted); a batch with other names, or a value that is not a number, is refused."""
    if not isinstance(values, Mapping) or not values:
        raise ConfigError(
            f"validation.metrics returned {type(values).__name__} for a batch: return a non-empty mapping "
            "of metric name to a scalar tensor"
        )
    keys = sorted(str(k) for k in values)
    if names is not None and keys != names:
        raise ConfigError(
            f"validation.metrics returned {keys} for one batch and {names} for another: return the same names"
        )
    row = []
    for key in keys:
        value = values[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            row.append(value.detach().reshape(()).to(device=device, dtype=torch.float64))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            row.append(torch.tensor(float(value), dtype=torch.float64, device=device))
        else:
            raise ConfigError(
                f"validation.metrics: {key} is {type(value).__name__}, not a scalar: return one number per metric"
            )
    return keys, torch.stack(row)
