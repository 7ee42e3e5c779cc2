"""The worker's side of the torchrun agent: stopping it when a restart cannot help.

torchrun's ``--max-restarts`` restarts the workers of a node after any non-zero exit. For
three exits that only repeats the failure: the node is going away (75, on the node whose
own termination notice it was), the run needs a human (77), or the configuration is bad
(2). In those cases local rank 0 leaves the code for the image's entrypoint (or
``ftfleet torchrun``: :mod:`ftfleet.trainer.torchrun`) in
``ftfleet.contract.agent_exit_file`` and sends its agent SIGTERM. The agent then shuts
its workers down and exits without closing the rendezvous, so the other nodes can go on
without this one. The entrypoint exits with the code left for it. An agent that restarts
nothing (``--max-restarts=0``, torchrun's default) is left to see the worker's exit
itself: its SIGTERM would only add torchrun's traceback.

No torch here: a config error stops the agent before torch is imported.
"""

from __future__ import annotations

import logging
import os
import signal

from ftfleet.contract import agent_exit_file

log = logging.getLogger("ftfleet.agent")


def torchrun_agent_pid() -> int | None:
    """The pid of the torchrun (torch.distributed.run) agent that started this worker, or
    None when this process was not started by one."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    return ppid if b"torch.distributed.run" in cmdline or b"torchrun" in cmdline else None


def stop_agent(exit_code: int, why: str, *, any_local_rank: bool = False, first: bool = False) -> int | None:
    """On local rank 0 of a torchrun worker (any local rank with ``any_local_rank``:
    where each rank may be the first to find out, and the agent would restart the
    workers after the first exit): leave ``exit_code`` for the entrypoint and stop the
    agent so that it does not restart the workers. With ``any_local_rank`` the first
    rank to leave the code stops the agent; the others leave it be (a second SIGTERM
    interrupts the agent's shutdown). Returns the agent's pid, or None when there is no
    agent to stop (not under torchrun, another local rank, or an agent that restarts
    nothing: the code is left for it all the same). ``first`` (with ``any_local_rank``):
    return the pid only to the rank that left the code, None to the others."""
    if int(os.environ.get("LOCAL_RANK", "0") or 0) != 0 and not any_local_rank:
        return None
    pid = torchrun_agent_pid()
    if pid is None:
        return None
    try:
        if any_local_rank:
            if not _leave_first(pid, exit_code):
                return None if first else pid  # another local rank left the code and stops the agent
        else:
            with open(agent_exit_file(pid), "w", encoding="utf-8") as f:
                f.write(f"{exit_code}\n")
    except OSError as exc:
        log.warning("cannot leave the node's exit code for the entrypoint: %s", exc)
    if os.environ.get("TORCHELASTIC_MAX_RESTARTS") == "0":
        return pid if first else None
    log.warning(
        "%s: stopping this node's torchrun agent (pid %d) so that it does not restart the workers; exit %d",
        why,
        pid,
        exit_code,
    )
    os.kill(pid, signal.SIGTERM)
    return pid


def first_on_node(exit_code: int, why: str) -> bool:
    """Whether this process is the first of its node to end with ``exit_code``, a code
    that every local rank reaches at once (a bad config): it leaves the code for the
    agent (:func:`stop_agent`) and says why, in one line for the node; the others end
    without a word. A torchrun agent ends all its workers once one has exited, so the
    one line must come from the first rank out, not from a fixed local rank that the
    agent may stop before it speaks. Not under torchrun: local rank 0 is the first."""
    if torchrun_agent_pid() is None:
        return int(os.environ.get("LOCAL_RANK", "0") or 0) == 0
    return stop_agent(exit_code, why, any_local_rank=True, first=True) is not None


def _leave_first(pid: int, exit_code: int) -> bool:
    """Create the agent's exit file with ``exit_code`` unless it exists; whether this
    process created it. A file older than the agent was left by an earlier agent with
    the same pid (a plain torchrun that nobody consumed it for) and is replaced."""
    path = agent_exit_file(pid)
    for _ in range(2):
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(f"{exit_code}\n")
            return True
        except FileExistsError:
            started = _started(pid)
            try:
                if started is None or os.stat(path).st_mtime >= started:
                    return False
                os.unlink(path)
            except FileNotFoundError:
                pass
    return False


def _started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, to the clock tick), or
    None when /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None
