"""Your own training loop with ftfleet's checkpoints and preemption handling.

    torchrun --standalone --nproc-per-node=2 examples/own_loop.py /tmp/own-loop

Run it again after a stop and it resumes where it stopped. SIGTERM (or a spot notice,
with FTFLEET_CLOUD=aws) stops every rank at the same step: emergency checkpoint, exit 75.
"""

import sys

import torch
import torch.distributed as dist

from ftfleet.trainer import AppState, CheckpointManager, Preemption


def main(ckpt_dir: str, steps: int = 300) -> int:
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = AppState(model, optimizer)  # also: scheduler=, extras={...}, per_rank={"loader": loader}
    ckpt = CheckpointManager(ckpt_dir, state, run_id="own-loop")  # creates its own gloo groups
    ckpt.restore()  # the newest valid checkpoint, if there is one
    preemption = Preemption(ckpt).start()  # SIGTERM and the cloud's notices
    progress = state.progress
    while progress.step < steps:
        if preemption.should_stop(progress.step):  # agreed by every rank
            break
        x = torch.randn(32, 16)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        ckpt.wait_for_staging()  # the last save's copy is done: the weights may change
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        if progress.step % 50 == 0:
            ckpt.save(progress.step)  # returns at once; written and committed behind
    code = preemption.finish(progress.step)  # final save (0), or emergency save + marker (75)
    preemption.close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:])))
