"""Command-line overrides as users type them, made into what Hydra composes.

Hydra's struct mode refuses a new key without ``+`` everywhere, free-form
mappings included: ``cluster.env.NCCL_DEBUG=INFO`` or
``hydra.launcher.extra_sbatch.constraint=h100`` (the option's own documented
example) were refused until written ``+...``, and ``+...`` fails once a profile
has set the key. For keys under a free-form mapping we write Hydra's own
``++`` (add or override) instead; the keys are still checked where they are
used (``train.*`` against LLM Foundry's schema). No Hydra option does this per
node, hence this glue.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Sequence

from hpc_llm.config.schema import HpcLlmConfig


def _dict_fields(cls: type, prefix: str) -> Iterator[str]:
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)]  # Optional[X]
        kind = inner[0] if typing.get_origin(hint) is typing.Union and len(inner) == 1 else hint
        if typing.get_origin(kind) is dict:
            yield f"{prefix}{f.name}"
        elif dataclasses.is_dataclass(kind):
            yield from _dict_fields(kind, f"{prefix}{f.name}.")  # type: ignore[arg-type]


def free_form_mappings() -> tuple[str, ...]:
    """Every mapping of the schema whose keys the user chooses (``cluster.env``, ``train``, ...)."""
    from hpc_llm.config.launcher_options import SlurmLauncherConf

    return (*_dict_fields(HpcLlmConfig, ""), *_dict_fields(SlurmLauncherConf, "hydra.launcher."))


def adding_keys(overrides: Sequence[str]) -> list[str]:
    """``key=value`` under a free-form mapping becomes ``++key=value``; everything else as given
    (flags such as ``--config-path``, ``+``/``~`` overrides, group choices ``a/b=c``)."""
    mappings = free_form_mappings()
    out = []
    for o in overrides:
        key = o.split("=", 1)[0]
        if "=" in o and not o.startswith(("-", "+", "~")) and any(key.startswith(m + ".") for m in mappings):
            o = "++" + o
        out.append(o)
    return out
