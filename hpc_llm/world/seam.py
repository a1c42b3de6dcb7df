"""The kinds of object the world hands out (a thread, a child process), as protocols. Stdlib only;
both sides."""

from __future__ import annotations

from typing import Any, Protocol


class Thread(Protocol):
    def start(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def is_alive(self) -> bool: ...


class Child(Protocol):
    """A child process the control plane started (the agent step's srun): what
    :class:`subprocess.Popen` offers of it."""

    pid: int
    returncode: int | None
    stderr: Any

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...
