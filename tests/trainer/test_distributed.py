"""The ranks of a torchrun attempt agree on a key namespace of their own in the agent's
store, whatever earlier attempts left there (trainer.distributed.agree_on_attempt)."""

from __future__ import annotations

import datetime
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch.distributed as dist

from ftfleet.trainer.distributed import agree_on_attempt

WORLD = 4
TIMEOUT = datetime.timedelta(seconds=20)


@pytest.fixture
def agent_store():
    """Stands in for the torchrun agent's store: it outlives every attempt."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def client(server: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)


def attempt(server: dist.TCPStore, ranks: range, seed: int, timeout: datetime.timedelta = TIMEOUT) -> list[str]:
    """Each rank in a thread of its own, starting after a random delay."""
    rng = random.Random(seed)
    delays = {r: rng.uniform(0, 0.3) for r in ranks}

    def rank_main(rank: int) -> str:
        time.sleep(delays[rank])
        return agree_on_attempt(client(server), rank, WORLD, timeout)

    with ThreadPoolExecutor(len(ranks)) as pool:
        return list(pool.map(rank_main, ranks))


def test_all_ranks_get_one_name(agent_store):
    names = attempt(agent_store, range(WORLD), seed=1)
    assert len(set(names)) == 1


@pytest.mark.parametrize("seed", range(5))
def test_a_restarted_attempt_gets_a_new_name_despite_the_keys_of_dead_workers(agent_store, seed):
    first = attempt(agent_store, range(WORLD), seed=seed)[0]
    # A later attempt died in startup: two ranks had posted their token, no answer came.
    store = client(agent_store)
    store.set("ftfleet/hello/1", "token-of-a-dead-worker")
    store.set("ftfleet/hello/3", "token-of-another-dead-worker")
    names = attempt(agent_store, range(WORLD), seed=seed + 100)
    assert len(set(names)) == 1 and names[0] != first


def test_rank_0_gives_up_when_a_rank_never_comes(agent_store):
    attempt(agent_store, range(WORLD), seed=2)  # every rank's hello key now exists, stale
    with pytest.raises(TimeoutError, match="not every rank of 4 joined"):
        attempt(agent_store, range(WORLD - 1), seed=3, timeout=datetime.timedelta(seconds=1))
