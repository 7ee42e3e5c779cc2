"""Your own training loop with ftfleet's checkpoints and preemption handling: a model
sharded by FSDP2, a StatefulDataLoader with worker processes, resumed exactly.

    ftfleet torchrun --standalone --nproc-per-node=2 examples/own_loop.py /tmp/own-loop [STEPS [SAVE_EVERY]]

Run it again after a stop and it resumes where it stopped, bit for bit: the weights,
the optimizer, each rank's RNG and each rank's place in its share of the data (one
epoch, shuffled; a longer run calls ``sampler.set_epoch``). SIGTERM (torchrun
passes it on; or a spot notice, with FTFLEET_CLOUD=aws) stops every rank at the same
step: emergency checkpoint, exit 75 (``ftfleet torchrun`` exits with the program's code;
plain torchrun, the same arguments, exits 1 after any failure).
"""

import sys

import torch
from torch.distributed.fsdp import fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader

from ftfleet.trainer import AppState, CheckpointManager, Preemption


def main(ckpt_dir: str, steps: int = 300, save_every: int = 50) -> int:
    torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)  # the same initial weights and data on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
    fully_shard(model)  # FSDP2: each rank holds a shard of every weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(x := torch.randn(1 << 16, 16), x.sum(dim=1, keepdim=True))
    loader = StatefulDataLoader(data, batch_size=16, sampler=torch.utils.data.DistributedSampler(data), num_workers=2)
    state = AppState(model, optimizer, per_rank={"loader": loader})  # + scheduler=, extras={}
    ckpt = CheckpointManager(ckpt_dir, state, run_id="own-loop")  # creates its own gloo groups
    ckpt.restore()  # the newest valid checkpoint, the loader's place included, if any
    preemption = Preemption(ckpt).start()  # SIGTERM and the cloud's notices
    progress, batches = state.progress, iter(loader)
    while progress.step < steps and not preemption.should_stop(progress.step):  # agreed by all
        x, y = next(batches)
        (model(x) - y).pow(2).mean().backward()
        ckpt.wait_for_staging()  # the last save's copy is done: the weights may change
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        if progress.step % save_every == 0:
            ckpt.save(progress.step)  # returns at once; written and committed behind
    code = preemption.finish(progress.step, release=False)  # final save: 0; emergency: 75
    torch.distributed.destroy_process_group()  # clean-up goes here, before the last step:
    preemption.release_node()  # after a notice, stop this node's torchrun agent (no restart)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:])))
