"""In-process restart with warm spares, on nvidia-resiliency-ext's ``inprocess.Wrapper``.

``python -m ftfleet.trainer.inprocess --nproc N --spares K -- --config FILE [key=value ...]``
starts N training processes and K spares on this node (:mod:`.launch`). Each runs
the reference trainer inside the wrapper (:mod:`.worker`). When a rank fails (an
exception, a SIGKILL, a hang past ``--soft-timeout``), the survivors do not exit: the
wrapper aborts the process groups, the ranks are reassigned (survivors keep their rank,
a spare takes the dead rank's), and :func:`~ftfleet.trainer.train.train` runs again in
the same processes, torch already imported: a fresh process group on a fresh store
prefix, then the restore, which finds the in-memory snapshots (``checkpoint.memory``;
the spare reads the dead rank's, which outlived it in shared memory) and ends
bit-identical. docs/RESILIENCE.md ("Recovery ladder") says what falls back to what.
"""

#: In-process attempts in a row that may fail before their first step, counted in each
#: process (a spare that takes over starts at 0); then that process gives up.
MAX_FAILED_STARTS = 5
