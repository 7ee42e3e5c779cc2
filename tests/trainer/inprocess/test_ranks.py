"""The in-process job's numbering across nodes (trainer/inprocess/ranks.py): who takes a
lost rank, node by node, computed alike in every process."""

from __future__ import annotations

import pytest

from ftfleet.trainer.inprocess.ranks import Layout, NodeFill, reassign


def test_the_layout_keeps_each_nodes_training_ranks_consecutive():
    layout = Layout(training_nodes=2, spare_nodes=1, nproc=2, spares=1)
    assert (layout.world_size, layout.active) == (9, 4)
    assert [layout.rank(n, i) for n in range(3) for i in range(2)] == [0, 1, 2, 3, 4, 5]
    assert [layout.rank(n, 2) for n in range(3)] == [6, 7, 8]  # the spare processes, after
    assert [layout.node_of(r) for r in range(9)] == [0, 0, 1, 1, 2, 2, 0, 1, 2]
    assert Layout.parse(layout.encode()) == layout


@pytest.mark.parametrize("text", ["", "2:1:2", "2:1:x:0", "0:1:2:0", "2:-1:2:0"])
def test_a_bad_layout_is_refused_in_one_line(text):
    with pytest.raises(ValueError) as exc:
        Layout.parse(text)
    assert "\n" not in str(exc.value)


def test_the_single_node_layout_is_the_launchers_old_numbering():
    layout = Layout(1, 0, 3, 2)  # 3 ranks and 2 spare processes on one machine
    assert [layout.rank(0, i) for i in range(5)] == [0, 1, 2, 3, 4]


def nodes_of(layout: Layout) -> list[int]:
    return [layout.node_of(r) for r in range(layout.world_size)]


def test_a_lost_node_is_taken_whole_by_a_spare_node_in_order():
    layout = Layout(3, 1, 2)  # nodes 0-2 train ranks 0-5, node 3 waits with ranks 6, 7
    plan = reassign(nodes_of(layout), layout.active, {2, 3})  # node 1 lost
    assert plan.stop is None and plan.active == 6
    assert plan.order == (0, 1, 6, 7, 4, 5)  # survivors keep their ranks; node 3 takes 2, 3 in order


def test_a_dead_process_is_replaced_by_its_own_nodes_spare_first():
    layout = Layout(2, 1, 2, spares=1)  # spare processes: rank 6 (node 0), 7 (node 1), 8 (node 2)
    plan = reassign(nodes_of(layout), layout.active, {3})
    assert plan.order[3] == 7, plan  # node 1's own spare, not the spare node's
    assert plan.order[:3] == (0, 1, 2) and plan.active == 4


def test_a_lost_node_with_its_spare_process_goes_to_the_spare_node():
    layout = Layout(2, 1, 2, spares=1)
    plan = reassign(nodes_of(layout), layout.active, {2, 3, 7})  # node 1 and its spare process
    assert plan.order[2:4] == (4, 5), plan  # the spare node's training processes, not node 0's spare


def test_two_lost_nodes_take_two_spare_nodes_without_mixing_them():
    layout = Layout(2, 2, 2)  # nodes 2 and 3 wait: ranks 4, 5 and 6, 7
    plan = reassign(nodes_of(layout), layout.active, {0, 1, 2, 3})
    taken = [nodes_of(layout)[r] for r in plan.order[:4]]
    assert taken[:2] == [taken[0]] * 2 and taken[2:] == [taken[2]] * 2 and taken[0] != taken[2], plan


def test_no_spare_stops_the_job_unless_it_may_shrink():
    layout = Layout(3, 0, 1)
    stop = reassign(nodes_of(layout), layout.active, {1})
    assert stop.active == 0 and "1 of 3 ranks lost and no spare" in stop.stop
    assert stop.order == (0, 2)
    shrunk = reassign(nodes_of(layout), layout.active, {1}, min_active=2)
    assert shrunk.stop is None and shrunk.active == 2 and shrunk.order == (0, 2)
    too_few = reassign(nodes_of(layout), layout.active, {0, 1}, min_active=2)
    assert too_few.stop and too_few.active == 0


def test_a_spare_node_that_took_over_keeps_its_node_through_the_next_failure():
    """The node of each rank moves with the rank: after the spare node took node 1's
    ranks, losing it again finds no spare (the job stops), and losing node 0 instead
    finds none either; nothing is mistaken for a spare."""
    layout = Layout(2, 1, 1)
    fill = NodeFill(layout)
    first = reassign(fill.nodes, layout.active, {1})
    assert first.order == (0, 2)
    after = [fill.nodes[r] for r in first.order]
    assert after == [0, 2]
    again = reassign(after, layout.active, {1})
    assert again.stop and again.order == (0,)


def test_a_hand_off_needs_a_waiting_spare_node_for_each_node_leaving():
    from ftfleet.trainer.inprocess.handoff import Handoff

    fill = NodeFill(Layout(3, 1, 2))  # nodes 0-2 train ranks 0-5; node 3 waits with 6, 7
    handoff = Handoff(fill)
    noticed = [False, True, False, False, False, False]  # rank 1's watcher holds the notice
    assert handoff.leaving(noticed) == {0} and handoff.possible({0})
    assert not handoff.possible({0, 1}), "one spare node for two leaving"
    assert not handoff.possible(set())
    plan = reassign(fill.nodes, 6, {2, 3})  # node 1 lost: node 3 takes its ranks
    fill.nodes, fill.active = [fill.nodes[r] for r in plan.order], plan.active
    assert fill.idle_nodes() == [] and handoff.node_of(2) == 3 and not handoff.possible({0})


def test_without_peer_copies_a_hand_off_needs_each_leaving_rank_replicated_on_a_node_that_stays():
    from ftfleet.trainer.inprocess.handoff import Handoff

    fill = NodeFill(Layout(2, 1, 2))  # nodes 0, 1 train ranks 0-3; node 2 waits with 4, 5
    handoff = Handoff(fill)
    across = {0: [2], 2: [0], 1: [3], 3: [1]}  # HSDP groups {0, 1} and {2, 3}: one copy per node
    assert handoff.replicated({0}, across) and handoff.replicated({1}, across)
    assert not handoff.replicated({0, 1}, across), "both copies leave"
    within = {0: [1], 1: [0], 2: [3], 3: [2]}  # replicas on the same node leave together
    assert not handoff.replicated({0}, within)
    assert not handoff.replicated({0}, {}), "no replicas (plain FSDP)"
    assert handoff.replicated(set(), {})


def test_a_node_is_lost_when_every_rank_it_held_is_gone():
    from ftfleet.trainer.inprocess.ranks import lost_nodes

    layout = Layout(2, 1, 2, 1)  # nodes 0, 1 train (0-3), node 2 waits (4, 5); spares 6, 7, 8
    nodes = nodes_of(layout)
    assert lost_nodes(nodes, {2, 3}) == 0  # node 1's spare process (7) is alive
    assert lost_nodes(nodes, {2, 3, 7}) == 1
    assert lost_nodes(nodes, {2, 3, 7, 4, 5, 8}) == 2
    assert lost_nodes(nodes, set()) == 0


def test_a_world_shrinks_by_whole_groups_and_the_broken_groups_survivors_wait():
    layout = Layout(1, 0, 6)  # one node, 6 ranks: HSDP 3 x 2, blocks {0,1} {2,3} {4,5}
    nodes = nodes_of(layout)
    plan = reassign(nodes, layout.active, {3}, min_active=2, group=2)
    assert plan.stop is None and plan.active == 4
    assert plan.order[:4] == (0, 1, 4, 5) and plan.order[4:] == (2,)  # 2 waits, like a spare
    # Two blocks broken: one left, at the minimum; below it the job stops.
    assert reassign(nodes, layout.active, {1, 3}, min_active=2, group=2).order[:2] == (4, 5)
    assert reassign(nodes, layout.active, {1, 3, 5}, min_active=2, group=2).stop
    # A spare fills a hole before any block is dropped.
    spare = Layout(1, 0, 6, 1)
    filled = reassign(nodes_of(spare), spare.active, {3}, min_active=2, group=2)
    assert filled.active == 6 and filled.order[3] == 6


def test_blocks_of_one_shrink_as_before():
    layout = Layout(3, 0, 1)
    assert reassign(nodes_of(layout), 3, {1}, min_active=2, group=1) == reassign(nodes_of(layout), 3, {1}, 2)


@pytest.mark.parametrize(
    ("group", "replicas", "active", "block"),
    [(1, 1, 4, 1), (1, 2, 4, 2), (1, 2, 8, 4), (2, 4, 8, 2), (1, 3, 4, 1)],
    ids=["plain", "hsdp", "hsdp-bigger-groups", "flag-wins", "replicas-do-not-divide"],
)
def test_a_smaller_world_keeps_whole_replica_groups_without_a_group_size(group, replicas, active, block):
    """The fleet's MIN:MAX sets no --group-size: under HSDP the block is one replica
    group, so a shrink never leaves a world that cannot form the mesh."""
    from ftfleet.trainer.inprocess.worker import shrink_block

    assert shrink_block(group, replicas, active) == block
