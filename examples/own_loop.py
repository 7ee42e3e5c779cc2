"""Your own training loop with ftfleet's checkpoints and preemption handling: a model
sharded by FSDP2, a StatefulDataLoader with worker processes, resumed exactly.

    torchrun --standalone --nproc-per-node=2 examples/own_loop.py /tmp/own-loop [STEPS [SAVE_EVERY]]

Run it again after a stop and it resumes where it stopped, bit for bit: the weights,
the optimizer, each rank's RNG and each rank's place in the data. SIGTERM (torchrun
passes it on; or a spot notice, with FTFLEET_CLOUD=aws) stops every rank at the same
step: emergency checkpoint, exit 75.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from ftfleet.trainer import AppState, CheckpointManager, Preemption


class Sums(torch.utils.data.Dataset):
    """Sample i: 16 features and their sum, a pure function of i."""

    def __len__(self) -> int:
        return 1 << 16

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(16, generator=torch.Generator().manual_seed(i))
        return x, x.sum(dim=0, keepdim=True)


def main(ckpt_dir: str, steps: int = 300, save_every: int = 50) -> int:
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1))
    for layer in (model[0], model[3]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + dist.get_rank())  # dropout: each rank its own stream
    sampler = StatefulDistributedSampler(Sums(), seed=0)  # this rank's share, shuffled per epoch
    loader = StatefulDataLoader(Sums(), batch_size=16, sampler=sampler, num_workers=2, drop_last=True)
    # The loader's position is per rank. AppState also gives the loader a generator of
    # its own (iter() would draw from the RNG the restore sets) and starts its workers in
    # process groups of their own (torchrun's SIGTERM to a rank would kill them).
    state = AppState(model, optimizer, per_rank={"loader": loader})  # also: scheduler=, extras=
    ckpt = CheckpointManager(ckpt_dir, state, run_id="own-loop")  # creates its own gloo groups
    ckpt.restore()  # the newest valid checkpoint, if there is one
    preemption = Preemption(ckpt).start()  # SIGTERM and the cloud's notices
    progress, per_epoch, batches = state.progress, len(loader), None
    while progress.step < steps:
        if preemption.should_stop(progress.step):  # agreed by every rank
            break
        if batches is None:  # the loader continues from its restored position
            sampler.set_epoch(progress.step // per_epoch)
            batches = iter(loader)
        x, y = next(batches)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        ckpt.wait_for_staging()  # the last save's copy is done: the weights may change
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        if progress.step % per_epoch == 0:
            batches = None  # the epoch's last batch: the next epoch, in its own order
        if progress.step % save_every == 0:
            ckpt.save(progress.step)  # returns at once; written and committed behind
    # The final save (0), or after a notice the emergency save and its marker (75). The
    # process's exit code is the run's: return it as the last thing the program does.
    code = preemption.finish(progress.step)
    preemption.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:])))
