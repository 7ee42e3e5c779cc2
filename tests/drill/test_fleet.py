"""The fleet drill's parts that need no bed (drill/fleet.py): its options refused in one
line, and a row measured from a run's event log, summary and the faulted node's memory."""

from __future__ import annotations

import json
import os

import pytest

from drill.cli import main
from drill.fleet import FleetOptions, FleetRow, _measure, render, trainer_overrides


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "1"], "--nodes 1 --spares 1: use 2 or more nodes"),
        (["--nodes", "3", "--faults", "lose-node,hang"], "with --nodes use all or some of lose-node"),
        (["--nodes", "3", "--replicas", "2"], "--replicas 2: use a divisor of --nodes 3"),
        (["--replicas", "2"], "--replicas 2: replica groups are the fleet drill's; add --nodes N"),
        (["--nodes", "3", "--collective-timeout", "0"], "--collective-timeout 0.0: use seconds > 0"),
    ],
)
def test_bad_fleet_options_are_refused_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_fleet_drill_takes_the_collective_timeout_it_is_given(tmp_path, monkeypatch):
    import drill.fleet

    seen = []

    def fake(opts):
        seen.append(opts.collective_timeout_s)
        return [], "sha"

    monkeypatch.setattr(drill.fleet, "run_fleet_drill", fake)
    main(["--nodes", "3", "--workdir", str(tmp_path)])
    main(["--nodes", "3", "--collective-timeout", "1.5", "--workdir", str(tmp_path)])
    assert seen == [2.0, 1.5]
    assert "parallel.collective_timeout_s=1.5" in trainer_overrides(
        FleetOptions(workdir=tmp_path, collective_timeout_s=1.5), tmp_path / "run"
    )


def test_a_replicated_drill_runs_hsdp_without_peer_copies(tmp_path):
    plain = trainer_overrides(FleetOptions(workdir=tmp_path), tmp_path / "run")
    assert not any(o.startswith(("parallel.replicas", "checkpoint.memory_peer_every")) for o in plain)
    hsdp = trainer_overrides(FleetOptions(workdir=tmp_path, nodes=4, replicas=2), tmp_path / "run")
    assert {"parallel.replicas=2", "checkpoint.memory_peer_every=0"} <= set(hsdp)
    assert "2 replica groups (HSDP)" in render([], FleetOptions(workdir=tmp_path, nodes=4, replicas=2))


def _run(tmp_path, events, resumed):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "summary.json").write_text(json.dumps({"resumed_from": resumed, "state_sha256": "x"}))
    return run_dir


def test_a_lost_nodes_row_from_the_event_log(tmp_path):
    events = [
        {"t": 10.0, "event": "start", "pids": [100, 101, 102]},
        *({"t": 10.0 + s, "event": "step", "step": s} for s in range(1, 16)),
        {"t": 27.0, "event": "start", "pids": [100, 200, 102]},  # the spare node took rank 1
        {"t": 27.5, "event": "step", "step": 16},
    ]
    run_dir = _run(tmp_path, events, {"tier": "memory-peer", "step": 15})
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "step-14").mkdir()
    manifest = shm / "step-14" / "manifest.json"
    manifest.write_text("{}")
    os.utime(manifest, (20.0, 20.0))  # committed before the others restarted without it
    (shm / "staged").write_bytes(b"x")  # bytes staged later and never committed: not a write
    row = FleetRow("lose-node")
    _measure(row, run_dir, 25.2, {0: 100, 2: 102}, shm, "lose-node")
    assert (row.fault_to_first_step_s, row.steps_lost, row.resumed_from) == (2.3, 0, "memory-peer")
    assert row.survivors_kept and not row.faulted_node_wrote_after and row.restarts == 1
    os.utime(manifest, (28.0, 28.0))  # a commit once the others had restarted: not fenced
    _measure(row, run_dir, 25.2, {0: 100, 2: 999}, shm, "lose-node")
    assert row.faulted_node_wrote_after and not row.survivors_kept
    row.state_equal = True
    assert not row.ok and "| lose-node | None |" not in render([row], _Opts())


class _Opts:
    nodes, spare_nodes, replicas, steps, fault_step = 3, 1, 1, 40, 15


def test_a_shrink_and_grow_row_checks_the_samples_instead_of_the_state(tmp_path):
    """4 nodes, R = 2: the loss at step 15 drops a replica group (the smaller world
    resumes from step 10), a resize at step 20 grows it back from that step."""
    from drill.fleet import SHRINK_GROW, _measure_shrink_grow, global_batch, run_steps

    opts = FleetOptions(workdir=tmp_path, nodes=4, replicas=2, steps=2)
    steps, batch = run_steps(opts, SHRINK_GROW), global_batch(opts, SHRINK_GROW)
    assert batch % 4 == 0 and batch % 2 == 0, "a whole number of samples per rank in both worlds"
    step = [{"t": float(s), "event": "step", "step": s} for s in range(1, 16)]
    step += [{"t": 20.0 + s - 10, "event": "step", "step": s} for s in range(11, 21)]
    step += [{"t": 40.0 + s - 20, "event": "step", "step": s} for s in range(21, steps + 1)]
    events = [
        {"t": 0.5, "event": "start", "world_size": 4, "pids": [1, 2, 3, 4]},
        {"t": 0.6, "event": "fresh"},
        {"t": 19.0, "event": "start", "world_size": 2, "pids": [3, 4]},
        {"t": 19.5, "event": "restored", "step": 10},
        {"t": 30.5, "event": "notice", "kind": "resize", "step": 20},
        {"t": 39.0, "event": "start", "world_size": 4, "pids": [5, 6, 3, 4]},
        {"t": 39.5, "event": "restored", "step": 20},
    ]
    run_dir = _run(tmp_path, sorted(events + step, key=lambda e: e["t"]), {"tier": "local", "step": 20})
    (run_dir / "samples").mkdir()

    def trace(name, ranges):
        lines = [f"{s} {(s - 1) * batch} {s * batch - 1}\n" for first, last in ranges for s in range(first, last + 1)]
        (run_dir / "samples" / name).write_text("".join(lines))

    trace("rank0-pid1.txt", [(1, 15)])  # the whole batch on one rank: enough to account for
    trace("rank0-pid3.txt", [(11, 20)])
    trace("rank0-pid5.txt", [(21, steps)])
    row = FleetRow(SHRINK_GROW)
    _measure_shrink_grow(row, run_dir, 15.5, {2: 3, 3: 4, 0: 1}, opts)
    assert (row.fault_to_first_step_s, row.steps_lost, row.grow_steps_lost) == (5.5, 5, 0)
    assert (row.grow_pause_s, row.resumed_from, row.restarts) == (11.0, "local", 2)
    assert row.survivors_kept and row.samples_once and row.state_equal is None and row.ok
    assert "every sample once: yes; the world grew back with a pause of 11.00 s" in render([row], _Opts())
    trace("rank0-pid3.txt", [(11, 19)])  # step 20 never trained at the smaller world
    _measure_shrink_grow(row, run_dir, 15.5, {2: 3, 3: 4, 0: 1}, opts)
    assert not row.samples_once and not row.ok
