"""Preloaded first by the loader workers' server (:func:`~ftfleet.trainer.data.workers.
start_worker_server`), for its side effect: the server leaves the trainer's process
group for one of its own, and every worker it forks starts there. A signal to the
trainer's group (torchrun stopping a rank) would otherwise end the server, and the
workers with it (each watches its parent), under a loader still reading from them.

Only in the server process (``python -c "from multiprocessing.forkserver import main
..."``): imported anywhere else, it does nothing.
"""

import os
import sys

if any("multiprocessing.forkserver" in arg for arg in getattr(sys, "orig_argv", ())):
    os.setpgid(0, 0)
