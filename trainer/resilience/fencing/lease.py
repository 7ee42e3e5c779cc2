"""One region trains a run: the run lease, an object in an object store written only with
conditional requests, names the holder (a stack, a region) and the job that may commit
the run's checkpoints.

The lease is one small JSON document (``format``, ``run_id``, ``holder``, ``job``,
``epoch``, ``expires_at``, ``ttl_s``). ``job`` names the job within the holder: the
store its ranks share (``host:port``), else the process, so that a relaunch beside a
job still running (two stores, one region) is a different job. Every write is
conditional on the version just read (S3's ``If-Match`` / ``If-None-Match: *``, a GCS
generation precondition; a local file under a lock for one machine), so two writers
never both succeed from the same state:

* **acquire** (:meth:`RunLease.acquire`, at the start of a run): absent, it is created;
  this job's own, it is renewed; another job's (of any holder) that expired more than
  ``skew_s`` ago by this machine's clock, it is taken over with the next ``epoch``;
  another job's still current: refused (:class:`LeaseHeld`, one line naming the holder
  and when it expires). A whole job started again on a new store therefore waits for its
  predecessor's lease to run out.
* **renew** (a thread, every ``ttl_s / 4``): the same conditional write of a new
  ``expires_at``, only while the document still names this job and epoch. A lease taken
  over meanwhile is lost for good.
* **the commit check** (:meth:`RunLease.problem`, from :func:`~.fence.problem_of`, right
  before every commit): no network, only what the renewals established. The holder
  counts its lease valid until ``ttl_s - skew_s -`` :data:`WRITE_MARGIN_S` after the
  start of its last successful write; a taker waits until ``skew_s`` after
  ``expires_at`` (``ttl_s`` after that same start, by the holder's clock). So two jobs
  never commit inside one lease's life while their clocks disagree by less than
  ``skew_s`` and a commit's write lands within ``WRITE_MARGIN_S + skew_s`` of its check;
  a holder cut off from the store stops committing when its last renewal runs out,
  whatever the network does.
* **release** (:meth:`RunLease.release`, when the run completes): ``expires_at`` set to
  0, so that another job may take it at once.

A commit refused for the lease leaves the process like a fenced one
(:data:`~ftfleet.contract.EXIT_FENCED`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ftfleet.contract import EXIT_FENCED
from ftfleet.errors import UserError

log = logging.getLogger("ftfleet.fencing")

FORMAT = "ftfleet-lease/1"
#: Conditional writes retried after a lost race before giving up on one attempt.
ATTEMPTS = 5
#: How long a commit's write may take after its check (a manifest PUT with its retries):
#: the holder stops committing this long before the taker may start.
WRITE_MARGIN_S = 30.0
#: How long one request to the lease's store may wait for its answer.
REQUEST_TIMEOUT_S = 5.0


class LeaseError(UserError):
    """The run lease cannot be held: one line naming why (exit 2, or 78 where a later
    start may succeed)."""


class LeaseHeld(LeaseError):
    """The run is held by another holder whose lease is current."""

    exit_code = EXIT_FENCED


class Versioned(Protocol):
    """Where the lease lives: an object read with its version, written on a condition
    (:class:`~ftfleet.trainer.checkpoint.tiers.base.ObjectStore`, :class:`LocalObject`)."""

    def read_versioned(self, rel: str) -> tuple[bytes | None, str | None]: ...
    def write_if(self, rel: str, data: bytes, version: str | None) -> str: ...


class LocalObject:
    """A lease on one machine (tests, drills): a file in ``directory``, versioned by the
    hash of its bytes, written under an exclusive lock by rename."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def read_versioned(self, rel: str) -> tuple[bytes | None, str | None]:
        try:
            data = (self.directory / rel).read_bytes()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def write_if(self, rel: str, data: bytes, version: str | None) -> str:
        from ftfleet.trainer.checkpoint.tiers.base import VersionConflict

        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / f".{rel}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _, now = self.read_versioned(rel)
            if now != version:
                raise VersionConflict(f"{self.directory / rel}: version {now}, not {version}")
            tmp = self.directory / f".{rel}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, self.directory / rel)
        return hashlib.sha256(data).hexdigest()


def open_lease_store(uri: str, *, endpoint_url: str | None = None) -> tuple[Versioned, str]:
    """(the store, the object's name in it) for a lease URI: ``s3://bucket/prefix/name``,
    ``gs://...``, or a local path."""
    if "://" not in uri:
        path = Path(uri)
        return LocalObject(path.parent), path.name
    from ftfleet.trainer.checkpoint.tiers.base import parse_uri

    parent, _, name = uri.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/"):
        raise UserError(f"checkpoint.lease_uri={uri!r}: name the lease object, e.g. s3://bucket/run/lease.json")
    # Short requests, few attempts: one stalled connection must not outlast a renewal
    # interval (a 60 s read would let the lease run out while the store is fine).
    if parse_uri(parent)[0] == "s3":
        from ftfleet.trainer.checkpoint.tiers.s3 import S3Store, make_client

        return S3Store(parent, client=make_client(endpoint_url, 3, timeout_s=REQUEST_TIMEOUT_S)), name
    from ftfleet.trainer.checkpoint.tiers.gcs import GCSStore

    return GCSStore(parent, retries=3, timeout_s=REQUEST_TIMEOUT_S), name


class RunLease:
    """The run lease of ``run_id`` as ``holder`` sees it (module doc)."""

    def __init__(
        self,
        store: Versioned,
        name: str,
        *,
        run_id: str,
        holder: str,
        job: str = "",
        ttl_s: float = 120.0,
        skew_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
    ) -> None:
        if not holder:
            raise UserError("checkpoint.lease_holder is empty: name who trains the run (e.g. its stack and region)")
        if not 0 < skew_s + WRITE_MARGIN_S + ttl_s / 4 < ttl_s:
            raise UserError(
                f"checkpoint.lease_ttl_s={ttl_s:g}: use more than {4 * (skew_s + WRITE_MARGIN_S) / 3:.0f} s "
                "(the clock skew and a commit's write, between renewals)"
            )
        self.store, self.name = store, name
        self.run_id, self.holder = run_id, holder
        self.job = job or f"pid {os.getpid()} on {os.uname().nodename}"
        self.ttl_s, self.skew_s = ttl_s, skew_s
        self.clock, self.monotonic = clock, monotonic
        self.epoch: int | None = None
        # On CLOCK_BOOTTIME, which (unlike CLOCK_MONOTONIC) counts a suspended machine's
        # time: a hibernated holder must find its lease run out when it resumes.
        self._valid_until = -float("inf")
        self._lost: str | None = None
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"RunLease({self.run_id} as {self.holder}, epoch {self.epoch})"

    # -- the document -------------------------------------------------------------

    def document(self) -> dict[str, Any] | None:
        """The lease as stored, checked as every read is; None when there is none. Reads
        only: what an operator's tool (``ftfleet failover``) shows and decides on."""
        return self._read()[0]

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        data, version = self.store.read_versioned(self.name)
        if data is None:
            return None, None
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}")
            float(doc["expires_at"]), int(doc["epoch"]), str(doc["holder"])
        except (ValueError, KeyError, TypeError) as exc:
            raise LeaseError(
                f"the run lease {self.name} does not read ({exc}): remove it only when no region trains run "
                f"{self.run_id}, then start again"
            ) from None
        if doc.get("run_id") != self.run_id:
            raise LeaseError(
                f"the run lease {self.name} is run {doc.get('run_id')!r}'s, not {self.run_id!r}: "
                "give each run a lease of its own (checkpoint.lease_uri)"
            )
        return doc, version

    def _write(self, epoch: int, version: str | None, started: float, expires_at: float | None = None) -> None:
        doc = {
            "format": FORMAT,
            "run_id": self.run_id,
            "holder": self.holder,
            "job": self.job,
            "epoch": epoch,
            "ttl_s": self.ttl_s,
            "expires_at": started + self.ttl_s if expires_at is None else expires_at,
        }
        self.store.write_if(self.name, json.dumps(doc, sort_keys=True).encode(), version)

    # -- the holder's side --------------------------------------------------------

    def acquire(self) -> None:
        """Hold the lease, or raise :class:`LeaseHeld` (module doc). Losing a race to
        another writer reads again; a store that cannot be reached raises."""
        from ftfleet.trainer.checkpoint.tiers.base import VersionConflict

        for _ in range(ATTEMPTS):
            started_wall, started = self.clock(), self.monotonic()
            doc, version = self._read()
            if doc is None:
                epoch, why = 1, "created"
            elif self._mine(doc):
                epoch, why = int(doc["epoch"]), "renewed"
            elif started_wall > float(doc["expires_at"]) + self.skew_s:
                epoch, why = int(doc["epoch"]) + 1, f"taken over from {doc['holder']} (expired)"
            else:
                left = float(doc["expires_at"]) - started_wall
                raise LeaseHeld(
                    f"run {self.run_id} is held by {doc['holder']} ({doc.get('job') or 'a job'}, "
                    f"lease epoch {doc['epoch']}, "
                    f"{max(0.0, left):.0f} s left, renewed while it trains): this holder ({self.holder}) "
                    "may not write it; stop the run there, or start here once its lease has run out "
                    f"({self.ttl_s + self.skew_s:.0f} s after its last renewal)"
                )
            try:
                self._write(epoch, version, started_wall)
            except VersionConflict:
                continue
            self.epoch, self._lost = epoch, None
            self._valid_until = started + self._validity()
            log.info("run lease of %s %s: epoch %d, holder %s", self.run_id, why, epoch, self.holder)
            return
        raise LeaseHeld(f"run {self.run_id}: the lease kept changing under {ATTEMPTS} attempts; start again")

    def renew(self) -> None:
        """Extend the lease while it is still this holder's epoch; a lease found taken
        over is lost for good. Failures to reach the store are kept for :meth:`problem`."""
        from ftfleet.trainer.checkpoint.tiers.base import VersionConflict

        if self._lost is not None or self.epoch is None:
            return
        for _ in range(ATTEMPTS):
            started_wall, started = self.clock(), self.monotonic()
            try:
                doc, version = self._read()
                if doc is None or not self._mine(doc) or int(doc["epoch"]) != self.epoch:
                    who = "nobody" if doc is None else f"{doc['holder']}, {doc.get('job')} (epoch {doc['epoch']})"
                    self._lost = (
                        f"the run lease was taken over: it names {who}, not {self.holder}, {self.job} "
                        f"(epoch {self.epoch})"
                    )
                    log.error("%s", self._lost)
                    return
                if self._stop.is_set():
                    return  # stopping: a release may follow, which this write must not undo
                self._write(self.epoch, version, started_wall)
            except VersionConflict:
                continue
            except Exception as exc:  # noqa: BLE001 - an unreachable store: the lease runs out
                self._last_error = f"{type(exc).__name__}: {exc}"
                log.warning("run lease not renewed: %s", self._last_error)
                return
            self._valid_until = started + self._validity()
            self._last_error = None
            return

    def _mine(self, doc: dict[str, Any]) -> bool:
        return doc["holder"] == self.holder and doc.get("job") == self.job

    def _validity(self) -> float:
        """How long after the start of a successful write this job may commit."""
        return self.ttl_s - self.skew_s - WRITE_MARGIN_S

    def problem(self) -> str | None:
        """Why this holder may not commit now (None: it may). No network."""
        if self._lost is not None:
            return self._lost
        if self.epoch is None:
            return f"the run lease of {self.run_id} is not held"
        if self.monotonic() >= self._valid_until:
            why = f" (last attempt: {self._last_error})" if self._last_error else ""
            return f"the run lease of {self.run_id} ran out: not renewed for {self._validity():.0f} s{why}"
        return None

    def release(self) -> None:
        """Let another holder take the lease at once (the run completed); nothing when
        it is no longer this holder's."""
        if self.epoch is None or self._lost is not None:
            return
        try:
            doc, version = self._read()
            if doc is not None and self._mine(doc) and int(doc["epoch"]) == self.epoch:
                self._write(self.epoch, version, self.clock(), expires_at=0.0)
                log.info("run lease of %s released", self.run_id)
        except Exception as exc:  # noqa: BLE001 - it then runs out by itself
            log.warning("run lease not released (it runs out in %.0f s): %s", self.ttl_s, exc)
        self.epoch = None

    # -- the renewing thread --------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._renewing, name="ftfleet-lease", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _renewing(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            self.renew()
            if self._lost is not None:
                return


_installed: RunLease | None = None


def install(lease: RunLease | None) -> None:
    """Make ``lease`` the one every commit of this process checks (None: none)."""
    global _installed
    _installed = lease


def problem() -> str | None:
    """Why this process may not commit for its run lease (None: it may, or it holds none)."""
    return None if _installed is None else _installed.problem()


def hold(cfg: Any, comm: Any) -> RunLease | None:
    """At the start of a run (``cfg``: the checkpoint config and the run's id): rank 0 of
    ``comm`` acquires the lease, installs it for its commits and keeps it renewed; every
    rank learns the outcome and raises the same :class:`LeaseHeld` (or UserError) when
    rank 0 could not. None without ``checkpoint.lease_uri``. Collective."""
    ckpt = cfg.checkpoint
    if not ckpt.lease_uri:
        return None
    lease, refusal = None, None
    if comm.rank == 0:
        try:
            store, name = open_lease_store(ckpt.lease_uri, endpoint_url=ckpt.s3_endpoint_url or None)
            from ftfleet.trainer.resilience.fencing.fence import current

            fence = current()
            job = f"store {fence.host}:{fence.port}" if fence is not None else ""
            lease = RunLease(store, name, run_id=cfg.run_id, holder=ckpt.lease_holder, job=job, ttl_s=ckpt.lease_ttl_s)
            lease.acquire()
        except LeaseError as exc:
            refusal = (type(exc) is LeaseHeld, exc.exit_code, str(exc))
        except Exception as exc:  # noqa: BLE001 - an unreachable store: nothing may be committed
            what = f"{type(exc).__name__}: {exc}"
            refusal = (False, EXIT_FENCED, f"the run lease {ckpt.lease_uri} cannot be read or written ({what})")
    refusal = comm.broadcast(refusal)
    if refusal is not None:
        held, code, message = refusal
        raise LeaseHeld(message) if held else LeaseError(message, exit_code=code)
    if lease is not None:
        install(lease)
        lease.start()
    return lease


def let_go(lease: RunLease | None, completed: bool) -> None:
    """At the end of a run: stop renewing; a completed run releases the lease (another
    region may take it at once), any other end keeps it until it runs out."""
    if lease is None:
        return
    lease.stop()
    if completed:
        lease.release()
    install(None)
