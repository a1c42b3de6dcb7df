"""Classes on the path whose unpickling does something, as a library's class might: the targets
of the corpus's ``BUILD``/``__setstate__``, ``NEWOBJ`` and ``NEWOBJ_EX`` pickles. Nothing here
runs unless an unpickler resolves these names."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Touch:
    """``BUILD`` calls ``__setstate__`` with the pickle's state: here, a path it creates."""

    def __setstate__(self, state: Any) -> None:
        Path(state).touch()


class NewTouch:
    """``NEWOBJ``/``NEWOBJ_EX`` call ``cls.__new__(cls, *args, **kwargs)``: here, a path it creates."""

    def __new__(cls, path: str = "", **kwargs: Any) -> NewTouch:
        Path(path or kwargs["path"]).touch()
        return super().__new__(cls)
