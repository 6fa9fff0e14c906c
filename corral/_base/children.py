"""corral's own child processes that talk to the server over two pipes.

The charge meter's measuring child (``corral._host.charge_child``) and an isolated Python
model's worker (``corral._compute.python.worker_child``) are started alike: the command gets
the numbers of its two pipe ends (the one it reads, the one it writes), it runs in a session
of its own (a Ctrl-C at the terminal stops the server, which then stops its children; should
the server die first, the child's next read of its pipe ends it), and it finds corral on its
``PYTHONPATH`` however the server was started. Each side of the pipes speaks
:class:`multiprocessing.connection.Connection` frames.

Example::

    child = start_piped_child([sys.executable, "-m", "corral._host.charge_child"])
    child.send.send_bytes(b"...")
    answer = child.receive.recv_bytes()
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

__all__ = ["PipedChild", "start_piped_child"]

# The folder corral is in: the child imports this corral, wherever it is installed.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class PipedChild:
    """A started child and the server's ends of its two pipes."""

    process: subprocess.Popen[bytes]
    #: What the server writes and the child reads.
    send: Connection
    #: What the child writes and the server reads.
    receive: Connection


def start_piped_child(command: Sequence[str], *, quiet: bool = False) -> PipedChild:
    """Start ``command`` with the child's ends of two new pipes as its two last arguments.

    The child reads the first and writes the second. ``quiet``: its output goes nowhere
    (else to the server's own stdout and stderr, where a model's prints belong). Every pipe
    end is closed if the start fails.
    """
    # Here, not at import: multiprocessing registers an atexit hook when imported.
    from multiprocessing.connection import Connection

    child_reads, server_writes = os.pipe()
    server_reads, child_writes = os.pipe()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if part
    )
    output = subprocess.DEVNULL if quiet else None
    try:
        process = subprocess.Popen(
            [*command, str(child_reads), str(child_writes)],
            pass_fds=(child_reads, child_writes),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            env=env,
            close_fds=True,
            start_new_session=True,
        )
    except BaseException:
        for fd in (child_reads, server_writes, server_reads, child_writes):
            os.close(fd)
        raise
    os.close(child_reads)
    os.close(child_writes)
    return PipedChild(
        process,
        Connection(server_writes, readable=False),
        Connection(server_reads, writable=False),
    )
