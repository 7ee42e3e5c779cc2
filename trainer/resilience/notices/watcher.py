"""The per-node notice watcher: signals and the cloud's metadata service -> Notices.

Three sources feed one store of pending notices:

* **Signals** (SIGTERM by default: torchrun forwards it, Kubernetes and systemd send
  it). The handler only records the time; :meth:`NoticeWatcher.pending` turns the
  record into a notice on the training thread. Previous Python-level handlers are
  chained and restored on :meth:`~NoticeWatcher.stop`.
* **The metadata service** of AWS (IMDSv2 spot instance-action and rebalance
  recommendation) or GCP (preempted, maintenance-event): daemon threads in
  :mod:`ftfleet.trainer.resilience.notices.metadata`.
* **Any other source** added with :meth:`NoticeWatcher.add_source` (or ``sources=``,
  or for every watcher of the process :func:`add_process_source`): one more thread of
  the same shape (:data:`SourceFactory`).

The pollers never hold the store's lock during I/O, so the training thread's
:meth:`~NoticeWatcher.pending` costs a lock and a dict lookup.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ftfleet.contract import CLOUDS as CONTRACT_CLOUDS
from ftfleet.contract import DEFAULT_METADATA_ENDPOINT
from ftfleet.errors import ConfigError
from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.resilience.notices.metadata import (
    GCP_MAINTENANCE_PATH,
    GCP_PREEMPTED_PATH,
    AwsPoller,
    GcpPoller,
    Poller,
)
from ftfleet.trainer.resilience.notices.notice import (
    AWS_LIFECYCLE_NOTICE_S,
    AWS_TERMINATION_NOTICE_S,
    GCP_MAINTENANCE_NOTICE_S,
    GCP_PREEMPTION_NOTICE_S,
    REBALANCE_BUDGET_S,
    SIGNAL_GRACE_S,
    Notice,
    NoticeKind,
    NoticeSource,
    most_urgent,
)

log = logging.getLogger(__name__)

CLOUDS = (*CONTRACT_CLOUDS, "none")

#: A source of notices: given the watcher's ``report(notice)``, ``clear(source)`` and
#: stop event, returns a daemon thread (:class:`~ftfleet.trainer.resilience.notices.metadata.Poller`:
#: ``start``, ``abort``, ``join``) that reports :class:`Notice` objects. Every source
#: produces the same notice type; agreement and the actions never care which it was.
SourceFactory = Callable[[Callable[[Notice], None], Callable[[NoticeSource], None], threading.Event], Poller]

#: Sources every watcher :meth:`NoticeWatcher.from_env` makes in this process starts
#: with (:func:`add_process_source`).
_PROCESS_SOURCES: list[SourceFactory] = []


def add_process_source(make: SourceFactory) -> None:
    """A source for every watcher this process makes from now on: what hosts the
    trainer knows of (the in-process launcher's round), the trainer does not."""
    _PROCESS_SOURCES.append(make)


#: Where the trainer config nests this block (ResilienceConfig), for error messages.
_KEY = "resilience.watcher"


@dataclasses.dataclass(kw_only=True, slots=True)
class WatcherConfig:
    """How the notice watcher polls. Deadlines are the clouds' documented notice
    periods; they are upper bounds: a notice that names its own moment (AWS) is
    believed when that is earlier."""

    poll_interval_s: float = 2.0
    """Seconds between two polls of the AWS metadata service (AWS suggests 5); also the first
    backoff step, and the GCP poll interval when the server sends no ETag."""
    gcp_wait_timeout_s: float = 60.0
    """``timeout_sec`` of one GCP ``wait_for_change`` long poll."""
    request_timeout_s: float = 2.0
    """Timeout of one HTTP request (added to the long-poll timeout on GCP)."""
    max_backoff_s: float = 10.0
    """Ceiling of the exponential backoff while an endpoint is unreachable."""
    aws_token_ttl_s: int = 21600
    """Lifetime requested for an IMDSv2 session token (1 to 21600)."""
    signals: list[str] = dataclasses.field(default_factory=lambda: ["SIGTERM"])
    """Signals that mean "this process is being stopped"."""
    chain_signal_handlers: bool = True
    """Also call the Python handler that was installed before ours."""
    signal_grace_s: float | None = None
    """Time to act after a signal. None: torchrun's shutdown timeout
    (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s)."""
    aws_termination_notice_s: float = AWS_TERMINATION_NOTICE_S
    """Longest time between an AWS spot instance-action and the interruption."""
    aws_lifecycle_notice_s: float = AWS_LIFECYCLE_NOTICE_S
    """Time between the group's termination (IMDS target-lifecycle-state ``Terminated``)
    and the end of its lifecycle hook's wait: the stack's terminationHookSeconds, or less."""
    gcp_preemption_notice_s: float = GCP_PREEMPTION_NOTICE_S
    """Time between GCP's instance/preempted turning TRUE and the VM stopping."""
    gcp_maintenance_notice_s: float = GCP_MAINTENANCE_NOTICE_S
    """Time between a GCP maintenance-event and the maintenance."""
    rebalance_budget_s: float = REBALANCE_BUDGET_S
    """Budget of the early checkpoint after a rebalance recommendation."""
    advisory_cooldown_s: float = 600.0
    """After an advisory notice is acknowledged, ignore new ones of the same kind for this
    long (a rank that sees the same recommendation later must not trigger a second early
    checkpoint)."""

    def __post_init__(self) -> None:
        positive = (
            "poll_interval_s",
            "gcp_wait_timeout_s",
            "request_timeout_s",
            "max_backoff_s",
            "aws_termination_notice_s",
            "aws_lifecycle_notice_s",
            "gcp_preemption_notice_s",
            "gcp_maintenance_notice_s",
            "rebalance_budget_s",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{_KEY}.{name}={getattr(self, name)!r}: use a positive number of seconds")
        if self.max_backoff_s < self.poll_interval_s:
            raise ConfigError(
                f"{_KEY}.max_backoff_s={self.max_backoff_s}: use at least poll_interval_s ({self.poll_interval_s})"
            )
        if not 1 <= self.aws_token_ttl_s <= 21600:
            raise ConfigError(f"{_KEY}.aws_token_ttl_s={self.aws_token_ttl_s}: IMDSv2 accepts 1 to 21600 seconds")
        if self.advisory_cooldown_s < 0:
            raise ConfigError(f"{_KEY}.advisory_cooldown_s={self.advisory_cooldown_s}: use 0 or more seconds")
        if self.signal_grace_s is not None and not self.signal_grace_s > 0:
            raise ConfigError(
                f"{_KEY}.signal_grace_s={self.signal_grace_s!r}: use a "
                "positive number of seconds, or leave it unset to follow "
                "torchrun's shutdown timeout"
            )
        self.signals = list(self.signals)
        for name in self.signals:
            if not isinstance(getattr(signal, str(name), None), signal.Signals):
                raise ConfigError(f"{_KEY}.signals: {name!r} is not a signal name (use e.g. SIGTERM, SIGUSR1)")
            if name in ("SIGKILL", "SIGSTOP"):
                raise ConfigError(f"{_KEY}.signals: {name} cannot be caught; remove it")

    def resolved_signal_grace_s(self, environ: Mapping[str, str] | None = None) -> float:
        if self.signal_grace_s is not None:
            return self.signal_grace_s
        environ = os.environ if environ is None else environ
        raw = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "")
        try:
            return float(raw) if raw and float(raw) > 0 else SIGNAL_GRACE_S
        except ValueError:
            return SIGNAL_GRACE_S


class NoticeWatcher:
    """Turns signals and metadata notices into :class:`Notice` objects.

    ``cloud`` is ``aws``, ``gcp`` or ``none`` (signals only). ``endpoint`` is the
    metadata service's base URL (default: the cloud's link-local address).
    """

    def __init__(
        self,
        cloud: str,
        endpoint: str | None = None,
        config: WatcherConfig | None = None,
        sources: Sequence[SourceFactory] = (),
    ) -> None:
        if cloud not in CLOUDS:
            raise ConfigError(f"cloud={cloud!r}: use one of {', '.join(CLOUDS)} (FTFLEET_CLOUD)")
        self.cloud = cloud
        self.config = config or WatcherConfig()
        self.endpoint = (endpoint or DEFAULT_METADATA_ENDPOINT.get(cloud, "")).rstrip("/")
        if cloud != "none" and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"metadata endpoint {endpoint!r}: use an http:// URL (FTFLEET_METADATA_ENDPOINT)")
        self._signal_grace_s = self.config.resolved_signal_grace_s()
        self._extra_sources = list(sources)
        self._lock = threading.Lock()
        self._notices: dict[NoticeSource, Notice] = {}
        self._cooldown_until: dict[NoticeKind, float] = {}
        self._stop = threading.Event()
        self._threads: list[Poller] = []
        self._started = False
        self._previous_handlers: dict[int, object] = {}
        # Written by the signal handler; read by pending(). A float assignment is
        # atomic under the GIL, so no lock is taken inside the handler.
        self._signal_at: float | None = None
        self._signum: int | None = None

    @classmethod
    def from_env(
        cls,
        config: WatcherConfig | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        poll_metadata: bool | None = None,
    ) -> NoticeWatcher:
        """A watcher for FTFLEET_CLOUD (unset: signals only) and
        FTFLEET_METADATA_ENDPOINT (unset: the cloud's default address).

        One process per node polls the metadata service (``poll_metadata``; default:
        the process with LOCAL_RANK 0); every process handles signals, since torchrun
        forwards them to every worker. Agreement spreads what one rank sees.
        """
        env = TrainerEnvironment(environ)
        cloud = env.cloud
        if poll_metadata is None:
            poll_metadata = (env.environ.get("LOCAL_RANK") or "0") == "0"
        return cls(cloud if poll_metadata else "none", env.metadata_endpoint, config, sources=_PROCESS_SOURCES)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> NoticeWatcher:
        """Install the signal handlers (main thread only) and start the pollers."""
        if self._started:
            raise RuntimeError("NoticeWatcher.start() called twice")
        self._started = True
        self._stop.clear()
        self._install_signal_handlers()
        cfg = self.config
        self._threads = [make(self._report, self._clear, self._stop) for make in self.sources()]
        for thread in self._threads:
            thread.start()
        log.log(
            logging.INFO if self.cloud != "none" else logging.DEBUG,  # a local run: only signals
            "notice watcher started: cloud=%s endpoint=%s signals=%s",
            self.cloud,
            self.endpoint or "-",
            ",".join(cfg.signals),
        )
        return self

    def sources(self) -> list[SourceFactory]:
        """The metadata sources this watcher polls: the cloud's, then any added ones."""
        cfg, url = self.config, self.endpoint
        cloud: list[SourceFactory] = []
        if self.cloud == "aws":
            cloud = [lambda report, clear, stop: AwsPoller(url, cfg, report, stop)]
        elif self.cloud == "gcp":
            cloud = [
                lambda report, clear, stop, path=path: GcpPoller(url, path, cfg, report, clear, stop)
                for path in (GCP_PREEMPTED_PATH, GCP_MAINTENANCE_PATH)
            ]
        return cloud + self._extra_sources

    def add_source(self, make: SourceFactory) -> None:
        """One more source of notices (before :meth:`start`)."""
        if self._started:
            raise RuntimeError("NoticeWatcher.add_source() after start()")
        self._extra_sources.append(make)

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop polling (cutting a long poll in flight) and restore the previous signal
        handlers. Pollers are daemon threads: one that does not end within ``timeout_s``
        does not keep the process alive."""
        self._stop.set()
        end = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.abort()
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        self._threads = []
        self._restore_signal_handlers()
        self._started = False

    def __enter__(self) -> NoticeWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the training loop calls --------------------------------------------

    def pending(self) -> Notice | None:
        """The most urgent notice not yet acknowledged, or None. Never blocks on I/O."""
        signal_at = self._signal_at
        with self._lock:
            if signal_at is not None and NoticeSource.SIGNAL not in self._notices:
                self._notices[NoticeSource.SIGNAL] = Notice.create(
                    NoticeKind.SIGNAL, NoticeSource.SIGNAL, self._signal_grace_s, received_at=signal_at
                )
                log.warning(
                    "received %s: %s",
                    signal.Signals(self._signum or 15).name,
                    self._notices[NoticeSource.SIGNAL].describe(),
                )
            return most_urgent(self._notices.values())

    def acknowledge(self, notice: Notice) -> None:
        """The trainer has handled ``notice`` (e.g. took the early checkpoint of a
        rebalance recommendation). Pending notices of its kind that are no more urgent
        are dropped; advisory ones of that kind are ignored for the cooldown."""
        with self._lock:
            for source, held in list(self._notices.items()):
                if held.kind == notice.kind and (notice.terminal or not held.terminal):
                    del self._notices[source]
            if not notice.terminal:
                self._cooldown_until[notice.kind] = time.time() + self.config.advisory_cooldown_s
            if notice.kind == NoticeKind.SIGNAL:
                self._signal_at = None

    def inject(self, notice: Notice) -> None:
        """Raise a notice from inside the process (drills, operator requests)."""
        self._report(notice)

    # -- internals ---------------------------------------------------------------

    def _report(self, notice: Notice) -> None:
        with self._lock:
            if not notice.terminal and self._cooldown_until.get(notice.kind, 0.0) > notice.received_at:
                log.info(
                    "ignoring %s: one was handled less than %.0fs ago",
                    notice.describe(),
                    self.config.advisory_cooldown_s,
                )
                return
            held = self._notices.get(notice.source)
            chosen = most_urgent([held, notice])
            self._notices[notice.source] = chosen
        if chosen is notice:
            log.warning("interruption notice: %s", notice.describe())

    def _clear(self, source: NoticeSource) -> None:
        """The source says the event is over: drop its advisory notice."""
        with self._lock:
            held = self._notices.get(source)
            if held is not None and not held.terminal:
                del self._notices[source]
                log.info("%s notice withdrawn by %s", held.kind, source)

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only a flag: no locks, no logging, no I/O in a signal handler.
        self._signum = signum
        self._signal_at = time.time()
        previous = self._previous_handlers.get(signum)
        if self.config.chain_signal_handlers and callable(previous):
            previous(signum, frame)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("notice watcher started outside the main thread: %s not handled", ",".join(self.config.signals))
            return
        for name in self.config.signals:
            signum = getattr(signal, name)
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous_handlers.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous_handlers = {}
