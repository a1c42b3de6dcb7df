"""The check before the queue for ``trainer=torchtitan``, in torchtitan's environment (in-job
side; the login side sends the points: :mod:`hpc_llm.launch.precheck`).

Each point's dotted keys (hpc_llm's own mapping and ``trainer.options.overrides``) must name a
field of torchtitan's ``Trainer.Config`` and take its value: an unknown key is one line with
the closest real key, as torchtitan's own CLI would say after the queue wait.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def check_point(point: dict[str, Any]) -> list[tuple[str, str]]:
    from torchtitan.trainer import Trainer

    from hpc_llm.job.rank.titan import run

    config = Trainer.Config()
    problems: list[tuple[str, str]] = []
    for key, value in (point.get("overrides") or {}).items():
        try:
            run.set_dotted(config, key, value)
        except KeyError as exc:
            problems.append((f"trainer.options.overrides.{key}", str(exc.args[0])))
    return problems


def check_points(points: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    return [check_point(p) for p in points]


def main(argv: list[str] | None = None) -> int:
    """``python -m hpc_llm.job.rank.titan.check`` reads the points (JSON) on stdin and prints
    one JSON list of problems per point."""
    points = json.loads(sys.stdin.read())
    print(json.dumps(check_points(points)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
