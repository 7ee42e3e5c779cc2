"""Preloaded last by the loader workers' server (:func:`~ftfleet.trainer.data.workers.
start_worker_server`), for its side effect: ``gc.freeze()`` over everything the preloads
imported (torch, the dataset's module).

The server forks every loader worker. Frozen objects stay out of the garbage
collector's passes: in the workers, whose passes would otherwise write to (and so copy)
the pages the fork shares with the server (Python's ``gc.freeze`` documentation gives
this reason to freeze before forking), and in the server itself, whose exit would
otherwise end with a pass over all of torch, during which the job's stderr, which the
server holds, stays open.
"""

import gc

gc.freeze()
