"""The capacity-loss drill's report (:mod:`drill.capacity`): the failover's times, the
steps it cost against what replication had not carried, and whether the final state
equals the uninterrupted reference run's; as text, Markdown and JSON.

Times are epoch seconds: the capacity loss (the spot notice and the worker group out of
capacity, posted together), the failover decision and the standby's sizing (when the
function's invocation that took them returned), and the standby's first step (its
event log).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

#: The standby's first step must come this soon after the failover decision.
FIRST_STEP_LIMIT_S = 180.0
#: What the standby's function runs at in a deployment.
DEPLOYED_WATCH = "every 2 minutes, moving the run after the stack's capacityLossMinutes"


@dataclasses.dataclass(kw_only=True)
class CapacityReport:
    loss_step: int
    steps: int
    loss_s: float
    watch_every_s: float
    t_loss: float | None = None
    t_decision: float | None = None
    t_sized: float | None = None
    t_first_standby_step: float | None = None
    home_last_step: int = 0
    """The last step the home trained."""
    home_committed_step: int | None = None
    """The home's last commit (its emergency checkpoint, after the notice)."""
    home_durable_at_loss: int | None = None
    """The newest verified step in the home's primary bucket at the loss."""
    home_durable_at_decision: int | None = None
    replica_at_decision: int | None = None
    """The newest verified step in the replica (the standby's primary) at the decision."""
    resumed_from: int | None = None
    resumed_tier: str | None = None
    final_step: int | None = None
    completed: bool = False
    state_sha256: str | None = None
    reference_sha256: str | None = None
    invocations: int = 0
    watch_errors: int = 0
    fenced_starts: int = 0
    """The standby's trainer starts refused (exit 78) while the home's lease was current."""
    problem: str = ""
    """Why the drill ended early ('' when the standby's node exited 0)."""
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- measures -------------------------------------------------------------------

    @staticmethod
    def _span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 2)

    @property
    def loss_to_decision_s(self) -> float | None:
        return self._span(self.t_loss, self.t_decision)

    @property
    def decision_to_sized_s(self) -> float | None:
        return self._span(self.t_decision, self.t_sized)

    @property
    def decision_to_first_step_s(self) -> float | None:
        return self._span(self.t_decision, self.t_first_standby_step)

    @property
    def loss_to_first_step_s(self) -> float | None:
        return self._span(self.t_loss, self.t_first_standby_step)

    @property
    def steps_recomputed(self) -> int | None:
        return None if self.resumed_from is None else self.home_last_step - self.resumed_from

    @property
    def not_replicated_steps(self) -> int | None:
        """Steps the home's primary held and the replica did not, at the decision."""
        a, b = self.home_durable_at_decision, self.replica_at_decision
        return None if a is None else a - (b or 0)

    @property
    def sha_match(self) -> bool:
        return bool(self.state_sha256) and self.state_sha256 == self.reference_sha256

    @property
    def ok(self) -> bool:
        first = self.decision_to_first_step_s
        return (
            not self.problem and self.completed and self.sha_match and first is not None and first <= FIRST_STEP_LIMIT_S
        )

    @property
    def reason(self) -> str:
        """One line: why the drill failed, or that it passed."""
        if self.problem:
            return self.problem.splitlines()[0]
        if not self.completed:
            return f"the standby's run did not complete (it ended at step {self.final_step})"
        if not self.sha_match:
            return (
                f"final state_sha256 {str(self.state_sha256)[:12]} differs from the "
                f"reference's {str(self.reference_sha256)[:12]}"
            )
        first = self.decision_to_first_step_s
        if first is None or first > FIRST_STEP_LIMIT_S:
            return (
                f"the standby's first step came {first} s after the failover decision (limit {FIRST_STEP_LIMIT_S:g} s)"
            )
        return (
            f"the run moved to the standby region by itself and completed there; first step {first:.1f} s "
            "after the failover decision; final state equals the reference"
        )

    # -- output ---------------------------------------------------------------------

    def rows(self) -> list[tuple[str, str]]:
        def s(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f} s"

        def n(x: int | None) -> str:
            return "-" if x is None else str(x)

        first = s(self.decision_to_first_step_s)
        tier = f" ({self.resumed_tier} tier)" if self.resumed_tier else ""
        return [
            ("capacity loss -> failover decision", s(self.loss_to_decision_s)),
            ("failover decision -> standby sized", s(self.decision_to_sized_s)),
            ("failover decision -> first standby step", f"{first} (limit {FIRST_STEP_LIMIT_S:g} s)"),
            ("capacity loss -> first standby step", s(self.loss_to_first_step_s)),
            ("home's last step", n(self.home_last_step)),
            ("standby starts fenced by the home's lease", n(self.fenced_starts)),
            ("standby resumed from step", n(self.resumed_from) + tier),
            ("steps computed again", n(self.steps_recomputed)),
            ("home's newest durable step at the loss", n(self.home_durable_at_loss)),
            ("home's newest durable step at the decision", n(self.home_durable_at_decision)),
            ("replica's newest step at the decision", n(self.replica_at_decision)),
            ("steps replication had not carried at the decision", n(self.not_replicated_steps)),
            ("final state_sha256 equals the reference's", "yes" if self.sha_match else "no"),
        ]

    @property
    def cloud(self) -> str:
        return str(self.settings.get("cloud", "aws"))

    def notes(self) -> list[str]:
        watch = "capacity_watch" if self.cloud == "aws" else "gcp_capacity_watch"
        lease = (
            f"the run lease's TTL is {self.settings.get('lease_ttl_s', 70):g} s here (the trainer's shortest; "
            "deployed: checkpoint.lease_ttl_s, 120 s by default): the standby trains once the home's lease has run "
            "out, the move never releases it"
        )
        first = (
            f"the standby's {watch} ran every {self.watch_every_s:g} s here and moved the run once the "
            f"home's workers had been short for want of capacity for {self.loss_s:g} s (deployed: {DEPLOYED_WATCH})"
        )
        if self.cloud == "gcp":
            return [
                first,
                "no Compute Engine emulator exists: drill/gcp_standin.py plays the regional managed instance groups "
                "(a stocked-out group records ZONE_RESOURCE_POOL_EXHAUSTED at each creation attempt)",
                lease,
                "one dual-region bucket (the GCS emulator) serves both regions: nothing to replicate",
            ]
        return [
            first,
            "moto cannot run out of capacity: drill/aws_standin.py hides the home workers' instances and answers "
            "their scaling activities with AWS's failed spot launch (InsufficientInstanceCapacity)",
            lease,
            "moto has no bucket replication: the drill copies the home's primary to its replica every "
            f"{self.settings.get('replication_lag_s', 1.0):g} s (manifests last) until the standby starts",
        ]

    def head(self) -> str:
        home, standby = ("us-central1", "us-east1") if self.cloud == "gcp" else ("us-east-1", "us-west-2")
        return (
            f"capacity loss drill ({self.cloud.upper()}): the home ({home}) loses its spot capacity at step "
            f"{self.loss_step} of {self.steps}; the run moves to its standby ({standby})"
        )

    def to_text(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        out = [self.head(), ""] + [f"{k:<{width}}  {v}" for k, v in rows]
        out += ["", f"final state_sha256 {str(self.state_sha256)[:16]}, reference {str(self.reference_sha256)[:16]}"]
        out += self.notes()
        out += ["", ("PASS: " if self.ok else "FAIL: ") + self.reason]
        return "\n".join(out) + "\n"

    def to_markdown(self) -> str:
        lines = [self.head(), "", "| measure | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in self.rows()]
        lines += [""] + [f"- {note}" for note in self.notes()]
        lines += [f"- {'PASS' if self.ok else 'FAIL'}: {self.reason}"]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            "ok": self.ok,
            "reason": self.reason,
            **fields,
            "loss_to_decision_s": self.loss_to_decision_s,
            "decision_to_sized_s": self.decision_to_sized_s,
            "decision_to_first_step_s": self.decision_to_first_step_s,
            "loss_to_first_step_s": self.loss_to_first_step_s,
            "first_step_limit_s": FIRST_STEP_LIMIT_S,
            "steps_recomputed": self.steps_recomputed,
            "not_replicated_steps": self.not_replicated_steps,
            "state_matches_reference": self.sha_match,
            "notes": self.notes(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"
