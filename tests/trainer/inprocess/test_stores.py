"""The job's stores and rounds (trainer/inprocess/stores.py), with a real store in this
process and launchers as threads: slots, a round formed with the spare nodes there, and
a late node joining the next round."""

from __future__ import annotations

import threading

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
    late = _join_in_thread(port, results, "late", **kw)
    late.join(0.5)
    assert late.is_alive(), "a node after the round formed must wait for the next round"
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
