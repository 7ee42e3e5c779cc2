"""The job's stores and rounds (trainer/inprocess/stores.py), with a real store in this
process and launchers as threads: slots, a round formed with the spare nodes there, and
a late node joining the next round."""

from __future__ import annotations

import threading
import time

from ftfleet.trainer.inprocess import stores
from ftfleet.trainer.inprocess.launch import free_port_pair


def _join_in_thread(port, results, name, **kwargs):
    def run():
        client = stores.connect("127.0.0.1", port, wait_s=10)
        results[name] = stores.join(client, **kwargs)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_round_forms_with_the_spare_nodes_there_and_a_late_node_waits_for_the_next():
    port = free_port_pair()
    host = stores.StoreHost(port)
    results: dict = {}
    kw = {"training": 2, "spares": 1, "node_rank": None, "settle_s": 0.3, "poll_s": 0.01}
    first = [_join_in_thread(port, results, n, **kw) for n in ("a", "b")]
    for t in first:
        t.join(10)
    assert sorted(results.values()) == [(0, 0, 0), (0, 1, 0)], results  # no spare came within the settle time
    waited: list[int] = []
    late = _join_in_thread(port, results, "late", **kw, on_wait=lambda: waited.append(1))
    late.join(0.5)
    assert late.is_alive(), "a node after the round formed must wait for the next round"
    # and says so, once, to the round it waits out (a world that shrank ends it: .resize),
    # and warms its processes (on_wait) once
    assert int(host.trainer.add(stores.round_key(0, "waiting"), 0)) == 1
    assert waited == [1]
    beat = int(host.trainer.add(stores.round_key(0, "waiting/0"), 0))
    time.sleep(0.5)
    assert int(host.trainer.add(stores.round_key(0, "waiting/0"), 0)) > beat, "a waiting node beats"
    host.next_round()
    other = _join_in_thread(port, results, "other", **kw)  # round 1 needs its two training nodes too
    late.join(10)
    other.join(10)
    assert sorted((results["late"], results["other"])) == [(1, 0, 0), (1, 1, 0)], results


def test_a_round_with_every_node_forms_at_once():
    port = free_port_pair()
    host = stores.StoreHost(port)  # serves as long as it is referenced
    results: dict = {}
    kw = {"training": 1, "spares": 2, "node_rank": None, "settle_s": 30.0, "poll_s": 0.01}
    threads = [_join_in_thread(port, results, n, **kw) for n in ("a", "b", "c")]
    for t in threads:
        t.join(10)  # well before the settle time: all three are there
    assert sorted(results.values()) == [(0, 0, 2), (0, 1, 2), (0, 2, 2)], results
    assert host.round == 0


def test_a_stop_key_is_read_back_for_its_round_only():
    port = free_port_pair()
    host = stores.StoreHost(port)
    client = stores.connect("127.0.0.1", port, wait_s=10)
    client.set(stores.round_key(0, "stop"), "2 of 3 ranks lost")
    assert stores.stop_reason(client, 0) == "2 of 3 ranks lost"
    assert stores.stop_reason(client, 1) is None
    assert host.next_round() == 1 and stores.wrapper_port(port, 1) == port + 2


def test_after_a_stop_the_next_round_opens_once_every_node_left_or_was_lost(monkeypatch):
    """Two nodes in round 0, one lost with the stop: the survivor's leaving opens round 1
    at once (not STOP_GRACE_S later); a launcher that joins meanwhile skips the stopped
    round instead of taking a slot in it."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    port = free_port_pair()
    monkeypatch.setenv("MASTER_PORT", str(port))
    host = stores.StoreHost(port)
    results: dict = {}
    kw = {"training": 2, "spares": 0, "node_rank": None, "settle_s": 5.0, "poll_s": 0.01}
    for t in [_join_in_thread(port, results, n, **kw) for n in ("a", "b")]:
        t.join(10)
    stopping: list = []
    serving = threading.Thread(target=host.serve, args=(stopping, 0.01), daemon=True)
    serving.start()
    stores.request_stop(stores.round_key(0, "stop"), "1 of 2 ranks lost", lost_nodes=1)
    stores.request_stop(stores.round_key(0, "stop"), "1 of 2 ranks lost", lost_nodes=1)  # every rank says it
    client = stores.connect("127.0.0.1", port, wait_s=10)
    assert int(client.add(stores.round_key(0, "lost"), 0)) == 1, "counted once"
    rejoined = _join_in_thread(port, results, "survivor", **kw)  # before round 1 opens
    time.sleep(0.3)
    assert host.round == 0, "a node of the round has not left it yet"
    client.add(stores.round_key(0, "done"), 1)  # the survivor's launcher left round 0
    replacement = _join_in_thread(port, results, "replacement", **kw)
    rejoined.join(3)
    replacement.join(3)
    stopping.append(1)
    assert host.round == 1 and int(client.add(stores.round_key(0, "nodes"), 0)) == 2, "round 0 took a third slot"
    assert sorted((results["survivor"], results["replacement"])) == [(1, 0, 0), (1, 1, 0)], results


def test_a_static_round_without_a_count_opens_after_the_grace(monkeypatch):
    port = free_port_pair()
    host = stores.StoreHost(port)
    monkeypatch.setattr(stores, "STOP_GRACE_S", 0.2)
    client = stores.connect("127.0.0.1", port, wait_s=10)
    client.set(stores.round_key(0, "stop"), "stop")
    stopping: list = []
    serving = threading.Thread(target=host.serve, args=(stopping, 0.01), daemon=True)
    serving.start()
    deadline = time.monotonic() + 5
    while host.round == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stopping.append(1)
    assert host.round == 1


def test_a_node_gets_back_the_slot_whose_ranks_it_trained_and_new_nodes_fill_the_rest():
    assert stores.assign_slots([-1, 2, 0], training=3) == [1, 2, 0]
    assert stores.assign_slots([1, 1, -1, -1], training=3) == [1, 0, 2, 3]  # a slot asked twice: the first
    assert stores.assign_slots([3, -1, -1, -1], training=3) == [0, 1, 2, 3]  # only training slots are asked for
    assert stores.assign_slots([-1, -1], training=2) == [0, 1]  # registration order, as before
    assert stores.assign_slots([1, 0], training=1) == [1, 0]  # slot 1 is a spare's: not asked for


def test_rejoining_nodes_take_their_slots_whatever_order_they_come_in():
    """Round 1: the replacement comes first, then the survivors in reverse order; each
    survivor gets the slot it trained in round 0, the replacement the one left."""
    port = free_port_pair()
    host = stores.StoreHost(port)
    host.next_round()
    results: dict = {}
    kw = {"training": 3, "spares": 0, "node_rank": None, "settle_s": 5.0, "poll_s": 0.01}
    threads = [_join_in_thread(port, results, "new", **kw)]
    time.sleep(0.2)
    for name, slot in (("had2", 2), ("had0", 0)):
        threads.append(_join_in_thread(port, results, name, prefer=slot, **kw))
        time.sleep(0.2)
    for t in threads:
        t.join(10)
    assert results == {"new": (1, 1, 0), "had2": (1, 2, 0), "had0": (1, 0, 0)}, results
