"""Imported only by the worker's forkserver (PoolRunner preloads it), for its side effect.

SIGTERM or SIGINT sent to the worker's whole process group — systemd's default
`KillMode=control-group`, an init that signals the group, a Ctrl-C in a terminal — must
drain exactly like SIGTERM to the worker alone: running handlers finish or are re-queued,
never killed by the signal. So the forkserver and every handler process forked from it
ignore both signals; they stop when the worker kills them, or when the worker dies (the
forkserver exits when its parent goes, and handler processes die with the forkserver:
PR_SET_PDEATHSIG in pool.child_main).
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
