"""The staging copy of an asynchronous save waits for the training stream's queued work
(the last optimizer step) before it copies; the host does not wait."""

from __future__ import annotations

import dataclasses
import threading

import torch

from ftfleet.trainer.checkpoint.manager import staging_options
from ftfleet.trainer.checkpoint.staging import OrderedStager


class FakeStream:
    """Records what is done to it, and on which thread."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def _note(self, *what) -> None:
        self.log.append((self.name, *what, threading.get_ident()))

    def record_event(self):
        self._note("record")
        return f"event-of-{self.name}"

    def wait_event(self, event) -> None:
        self._note("wait", event)

    def synchronize(self) -> None:
        self._note("synchronize")

    def __enter__(self):
        self._note("enter")
        return self

    def __exit__(self, *exc) -> None:
        self._note("exit")


def test_the_staging_stream_waits_for_the_training_stream_before_it_copies():
    log: list = []
    compute, side = FakeStream("compute", log), FakeStream("staging", log)
    stager = OrderedStager(staging_options(cuda=False), current_stream=lambda: compute)
    # What the stager is on a GPU: a side stream and non-blocking copies.
    stager._staging_stream = side
    stager._config = dataclasses.replace(stager._config, use_non_blocking_copy=True)
    stager._state_dict_stager.stage = lambda sd, non_blocking: (log.append(("copy", non_blocking, 0)), sd)[1]
    staged = stager.stage({"w": torch.ones(2)}).result()
    stager.close()
    assert torch.equal(staged["w"], torch.ones(2))
    steps = [entry[:-1] for entry in log]
    assert steps == [
        ("compute", "record"),
        ("staging", "wait", "event-of-compute"),
        ("staging", "enter"),
        ("copy", True),
        ("staging", "exit"),
        ("staging", "synchronize"),
    ]
    caller, worker = log[0][-1], log[1][-1]
    assert caller == threading.get_ident() and worker != caller  # recorded now, waited behind


def test_on_cpu_there_is_nothing_to_wait_for_and_the_copy_is_exact():
    stager = OrderedStager(staging_options(cuda=False))
    state = {"w": torch.arange(6.0).reshape(2, 3)}
    staged = stager.stage(state).result()
    stager.close()
    assert torch.equal(staged["w"], state["w"]) and staged["w"].data_ptr() != state["w"].data_ptr()


def test_a_stager_whose_copier_was_closed_after_a_stage_stages_again():
    """torch 2.11 closes DefaultStager's StateDictStager after every stage (its copier
    table emptied: pytorch/pytorch#183413), so the second save of a kept stager failed
    with KeyError: <class 'type'>. Closing it by hand is what 2.11 does."""
    stager = OrderedStager(staging_options(cuda=False))
    state = {"w": torch.arange(4.0), "groups": [{"betas": (0.9, 0.95), "fused": None}]}
    try:
        stager.stage(state).result()
        stager._state_dict_stager.close()
        again = stager.stage(state).result()
    finally:
        stager.close()
    assert torch.equal(again["w"], state["w"]) and again["groups"] == state["groups"]
