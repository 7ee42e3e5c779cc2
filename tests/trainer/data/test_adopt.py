"""A loop's own DataLoader registered in AppState (trainer/data/loader.py: adopt). The
SIGTERM and SIGKILL story through torchrun is tests/trainer/scenarios/test_own_loop.py."""

from __future__ import annotations

import os

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from ftfleet.trainer.checkpoint.state import AppState
from ftfleet.trainer.data.loader import adopt
from ftfleet.trainer.data.workers import starts_in_own_group


def loader(**kwargs) -> StatefulDataLoader:
    return StatefulDataLoader(list(range(8)), batch_size=2, **kwargs)


def test_iter_after_adoption_leaves_the_global_rng_alone():
    """Without a generator, iter() draws the workers' base seed from torch's global RNG:
    after a restore, from the state the restore set."""
    plain, adopted = loader(), loader()
    adopt(adopted, seed=5)
    torch.manual_seed(0)
    iter(adopted)
    after_adopted = torch.rand(())
    torch.manual_seed(0)
    iter(plain)
    after_plain = torch.rand(())
    torch.manual_seed(0)
    assert torch.equal(after_adopted, torch.rand(())) and not torch.equal(after_plain, torch.rand(()))


def test_a_loaders_own_generator_and_init_are_kept_and_adoption_is_done_once(monkeypatch):
    calls = []
    generator = torch.Generator().manual_seed(1)
    mine = loader(num_workers=2, generator=generator, worker_init_fn=calls.append)
    assert adopt(mine, seed=5) == ["workers in process groups of their own"]
    assert mine.generator is generator and starts_in_own_group(mine.worker_init_fn)
    assert adopt(mine, seed=5) == []
    monkeypatch.setattr(os, "setpgid", lambda pid, pgid: calls.append(("setpgid", pid, pgid)))
    mine.worker_init_fn(3)
    assert calls == [("setpgid", 0, 0), 3]  # its own group first, then the loader's init


def test_app_state_adopts_the_loaders_it_holds():
    held = loader(num_workers=1)
    AppState(torch.nn.Linear(1, 1), rank=0, per_rank={"loader": held})
    assert held.generator is not None and starts_in_own_group(held.worker_init_fn)


def test_the_servers_preload_moves_only_the_forkservers_process_group():
    import importlib

    group = os.getpgid(0)
    importlib.reload(importlib.import_module("ftfleet.trainer.data.server"))
    assert os.getpgid(0) == group


def test_adoption_leaves_the_process_start_method_unset():
    """A loop may still call multiprocessing.set_start_method after building AppState."""
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    adopt(loader(num_workers=1), seed=5)
    assert multiprocessing.get_start_method(allow_none=True) == before
