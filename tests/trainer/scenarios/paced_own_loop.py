"""examples/own_loop.py with each optimizer step slowed by OWN_LOOP_STEP_DELAY_S
seconds, so that a test's signal lands mid-run. Run like the example:
``torchrun ... tests/trainer/scenarios/paced_own_loop.py CKPT [STEPS [SAVE_EVERY]]``."""

import os
import runpy
import sys
import time
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "own_loop.py"
DELAY_S = float(os.environ.get("OWN_LOOP_STEP_DELAY_S", "0.2"))
step = torch.optim.AdamW.step


def paced(self, *args, **kwargs):
    time.sleep(DELAY_S)
    return step(self, *args, **kwargs)


torch.optim.AdamW.step = paced
sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
