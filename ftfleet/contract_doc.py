"""docs/CONTRACT.md, rendered from :mod:`ftfleet.contract` (``python -m ftfleet.contract``;
a test fails when the page and the module differ)."""

from __future__ import annotations

from ftfleet.contract import (
    AGENT_EXIT_FILE,
    AGENT_STOP_EXITS,
    CLOUDS,
    EFA_DEVICE_DIR,
    EFA_ENV,
    EXIT_CODES,
    EXIT_CONFIG,
    EXIT_FENCED,
    EXIT_PREEMPTED,
    EXIT_UNRECOVERABLE,
    INTERRUPTION_BURST_S,
    INTERRUPTION_PRIOR_KEY,
    INTERRUPTION_PRIOR_MAX,
    INTERRUPTION_WINDOW_S,
    MANIFEST_NAME,
    MARKER_DIR,
    MARKER_NOTICE_SLACK_S,
    MAX_LOCAL_RANKS,
    METRICS_NAMESPACE,
    METRICS_PORT,
    NODE_FINAL_EXITS,
    NODE_METRIC_PERIOD_S,
    NODE_METRICS,
    RDZV_PORT,
    REBALANCE_TAG,
    REPLACEMENT_BUDGET,
    REPLACEMENT_WINDOW_S,
    SPOT_INTERRUPTION_TAG,
    STEP_DIR_PREFIX,
    TERMINATION_HOOK_NAME,
    TRAINER_ENV,
    TRAINER_UID,
    CommitMarker,
    Interruption,
    InterruptionPrior,
    NodeMetric,
    marker_key,
    replacement_key,
)


def _render_remediation() -> list[str]:
    example = InterruptionPrior(
        "aws",
        "aws-prod-llm",
        1767229200.0,
        (Interruption("i-0123456789abcdef0", 1767225600.0, "us-east-1a", "p5.48xlarge"),),
    )
    lines = [
        "## Remediation functions and the node",
        "",
        "What the functions in `lambdas/` and the nodes agree on.",
        "",
        f"- Metrics namespace: `{METRICS_NAMESPACE}` (the node role may publish only there).",
        f"- Termination lifecycle hook on every group: `{TERMINATION_HOOK_NAME}`. The node completes its "
        "action (CONTINUE) right after its commit marker is written, whether the notice was the spot "
        "warning or the group's own termination (IMDS `autoscaling/target-lifecycle-state` = "
        "`Terminated`); lifecycle_handoff completes it when it sees the marker, or at its deadline.",
        f"- A termination marker releases its node when it names the node and the run, its reason is not "
        f"`rebalance`, and it was written at most {MARKER_NOTICE_SLACK_S:.0f} s before the lifecycle event "
        "(an older one is stale).",
        f"- Instance tags set by spot_interruption (value: the notice's time, ISO 8601): "
        f"`{SPOT_INTERRUPTION_TAG}`, `{REBALANCE_TAG}`.",
        "",
        "### Per-node metrics",
        "",
        (NodeMetric.__doc__ or "").strip().replace("\n    ", "\n"),
        "",
        f"One data point every {NODE_METRIC_PERIOD_S} s.",
        "",
        "| metric | unit | meaning |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{m.name}` | {m.unit} | {m.doc} |" for m in NODE_METRICS]
    lines += [
        "",
        "### Interruption-rate prior",
        "",
        f"`<durable tier root>/{INTERRUPTION_PRIOR_KEY}`, next to the checkpoints.",
        "",
        (InterruptionPrior.__doc__ or "").strip().replace("\n    ", "\n"),
        "",
        f"Window {INTERRUPTION_WINDOW_S / 86400:.0f} days; interruptions less than {INTERRUPTION_BURST_S:.0f} s "
        f"apart are one job interruption; at most {INTERRUPTION_PRIOR_MAX} kept. Example:",
        "",
        "```json",
        example.to_json(),
        "```",
        "",
    ]
    return lines


# ---------------------------------------------------------------------------
# docs/CONTRACT.md
# ---------------------------------------------------------------------------


def render_markdown() -> str:
    lines = [
        "# The ftfleet contract",
        "",
        "Generated from `ftfleet/contract.py` by `python -m ftfleet.contract`; "
        "a test fails when the two differ. Change the module, then regenerate.",
        "",
        "## Trainer container environment",
        "",
        "The fleet's user data (AWS launch template, GCP instance template) sets these "
        "for the trainer image; the image's entrypoint checks them before torchrun starts.",
        "",
        "| variable | required | meaning | example |",
        "| --- | --- | --- | --- |",
    ]
    for v in TRAINER_ENV:
        lines.append(f"| `{v.name}` | {'yes' if v.required else 'no'} | {v.doc} | `{v.example}` |")
    lines += [
        "",
        "## Exit codes",
        "",
        "| code | meaning |",
        "| --- | --- |",
    ]
    lines += [f"| {code} | {text} |" for code, text in sorted(EXIT_CODES.items())]
    lines += [
        "",
        f"A worker's {EXIT_PREEMPTED} is also the container's: on the node whose own notice "
        "was handled, local rank 0 stops its torchrun agent (SIGTERM) once the commit "
        "marker is written, so that the agent does not restart workers on a machine that is "
        f"going away, and leaves {EXIT_PREEMPTED} in "
        f"`${{TMPDIR:-/tmp}}/{AGENT_EXIT_FILE.format(pid='<agent pid>')}`, which the "
        "entrypoint exits with. Every other node's agent restarts its workers, which "
        "rendezvous without the lost node and resume from the emergency checkpoint. "
        f"{EXIT_CONFIG} and {EXIT_UNRECOVERABLE} stop the agent the same way on every node: "
        "restarting would repeat the failure. "
        f"{EXIT_FENCED} stops the agent too, which would restart its workers into a generation "
        "that no longer owns the run; the supervisor restarts the container, whose new agent "
        "joins the newest generation. A worker whose launcher is gone exits "
        f"{EXIT_FENCED} on its own, within a second, taking its child processes with it.",
    ]
    lines += [
        "",
        "## Checkpoint layout",
        "",
        f"- Checkpoint of step N: `<tier root>/{STEP_DIR_PREFIX}N/` (no zero padding).",
        f"- It exists only once `<tier root>/{STEP_DIR_PREFIX}N/{MANIFEST_NAME}` exists; "
        "the manifest is written last and atomically (and uploaded last to a bucket).",
        f"- Commit markers: `<tier root>/{marker_key('<node id>')}`.",
        f"- The image runs as uid/gid {TRAINER_UID}; the fleet makes `FTFLEET_CKPT_DIR`, its "
        f"`{MARKER_DIR}/` and `FTFLEET_RUN_DIR` writable for it, and the entrypoint checks that "
        f"they are before torch is imported (exit {EXIT_CONFIG}, one line naming the directory).",
        "",
        "## Node and image",
        "",
        f"- Clouds: {', '.join(f'`{c}`' for c in CLOUDS)}.",
        f"- Ports: on the coordinator, the job's stores (inprocess) listen on {RDZV_PORT}-"
        f"{RDZV_PORT + 2}, or torchrun's c10d rendezvous on {RDZV_PORT}; local rank r "
        f"serves Prometheus metrics on {METRICS_PORT} + r (the image exposes "
        f"{METRICS_PORT}-{METRICS_PORT + MAX_LOCAL_RANKS - 1}); the container uses the host's network.",
        f"- The node's supervisor does not restart the container after exit "
        f"{', '.join(map(str, NODE_FINAL_EXITS))}; a worker's {', '.join(map(str, AGENT_STOP_EXITS[:-1]))} "
        f"or {AGENT_STOP_EXITS[-1]} "
        "stops its torchrun agent.",
        f"- EFA: with EFA enabled the node passes every `{EFA_DEVICE_DIR}/uverbs*` device into the "
        "container, and the entrypoint then sets "
        + ", ".join(f"`{k}={v}`" for k, v in EFA_ENV.items())
        + " for the trainer.",
        f"- Replacements: a node that cannot boot records `{replacement_key('<run id>', '<role>', 0, '<instance id>')}`"
        " (the number: unix seconds) in the primary bucket and marks itself Unhealthy only while its group "
        f"has at most {REPLACEMENT_BUDGET} such records in the last {REPLACEMENT_WINDOW_S // 60} minutes; "
        "past that it leaves the group without a replacement (or, at the group's minimum size, stays up and says why).",
        "",
        "## Commit marker",
        "",
        (CommitMarker.__doc__ or "").strip().replace("\n    ", "\n"),
        "",
        "Example:",
        "",
        "```json",
        CommitMarker("aws-prod-llm", "i-0123456789abcdef0", 1200, "termination", False, 1767225600.0).to_json(),
        "```",
        "",
    ]
    lines += _render_remediation()
    return "\n".join(lines)
