"""Where interruption notices come from: every source produces one :class:`Notice`.

* ``notice.py``: the notice itself (what is coming, who said so, by when) and which of
  several is the most urgent;
* ``watcher.py``: the node's watcher, one store of pending notices fed by signals
  (SIGTERM), the cloud's metadata service and any source a user adds;
* ``metadata.py``: the pollers of AWS IMDSv2 and the GCP metadata server.

What the ranks do with a notice is the preemption sequence's
(:mod:`ftfleet.trainer.resilience.preemption`).
"""

from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource, most_urgent
from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher, WatcherConfig

__all__ = ["Notice", "NoticeKind", "NoticeSource", "NoticeWatcher", "WatcherConfig", "most_urgent"]
