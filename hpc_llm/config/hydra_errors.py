"""Turn bad input into one line on stderr, for every entry point.

Hydra prints composition errors over several lines (and tracebacks for
others); users asked for one line that names the key and the allowed values.
We make Hydra re-raise (HYDRA_FULL_ERROR=1) and format the exceptions we know.
A user who sets HYDRA_FULL_ERROR=1 themselves gets Hydra's full output.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from hpc_llm.config.launcher_options import launcher_hint
from hpc_llm.errors import ConfigError, Failed, allowed

EXIT_BAD_INPUT = 2
EXIT_JOB_FAILED = 1


def _die(message: str, code: int, more: list[str] | None = None) -> None:
    for line in [message, *(more or [])]:
        sys.stderr.write(f"hpc_llm: error: {' '.join(line.split())}\n")
    sys.stderr.flush()
    raise SystemExit(code)


def format_missing(exc: MissingConfigException) -> str:
    missing = exc.missing_cfg_file or ""
    options = exc.options or []
    if "/" in missing:
        group, name = missing.rsplit("/", 1)
        from hpc_llm.config.site import missing_hint

        return f"unknown {group} '{name}'; allowed: {allowed(options)}{missing_hint(group, name)}"
    first = str(exc).strip().splitlines()[0]
    return f"{first}; allowed: {allowed(options)}" if options else first


def _innermost(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _schema_class(name: str) -> type | None:
    from hpc_llm.config import schema

    obj = getattr(schema, name, None)
    return obj if isinstance(obj, type) else None


def did_you_mean(key: str, allowed_keys: list[str]) -> str:
    """'; did you mean X?' for an unknown key: the closest allowed key, or ``train.KEY`` for a key of
    LLM Foundry's train config typed at the top level (``variables.x``, ``optimizer.lr``)."""
    import difflib

    from hpc_llm.config.llmfoundry_keys import TRAIN_CONFIG_KEYS

    parent, _, leaf = key.rpartition(".")
    if not parent and leaf in TRAIN_CONFIG_KEYS:
        typed = next((a.lstrip("+") for a in sys.argv[1:] if a.lstrip("+").startswith((leaf + ".", leaf + "="))), leaf)
        return f"; did you mean train.{typed}? (LLM Foundry's train config is under train.)"
    close = difflib.get_close_matches(leaf, allowed_keys, n=1, cutoff=0.6)
    return f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""


def _as_typed(key: str) -> str:
    """The override the user typed for ``key`` (``experiment=mpt_tiny``), from the command line."""
    for arg in sys.argv[1:]:
        if arg.split("=", 1)[0].lstrip("+~") == key:
            return arg
    return key


def format_no_match(exc: BaseException) -> str | None:
    """Hydra's "Could not override 'experiment'. No match in the defaults list." for a group
    given without ``+``: the ``+`` form."""
    m = re.match(r"Could not override '([^']+)'\. No match in the defaults list", str(exc).strip())
    if not m:
        return None
    typed = _as_typed(m.group(1))
    return (
        f"{typed}: '{m.group(1)}' is a config group the defaults list does not name, so it is added, not "
        f"overridden (Hydra: No match in the defaults list); did you mean +{typed.lstrip('+')}?"
    )


def format_omegaconf(exc: BaseException) -> str:
    inner = _innermost(exc)
    full_key = getattr(inner, "full_key", None)
    text = str(inner).strip()
    first = text.splitlines()[0] if text else type(inner).__name__
    # an error inside a config file (a profile, an experiment) comes as Hydra's text only:
    # "In 'cluster/naive': ConfigKeyError raised while composing config:\nKey 'x' not in ..."
    where_file = re.match(r"(In '[^']+'): \w+ raised while composing config:", first)
    if where_file:
        full_key = full_key or next(iter(re.findall(r"full_key: (\S+)", text)), None)
        first = text.splitlines()[1].strip() if len(text.splitlines()) > 1 else first
    m = re.match(r"Key '([^']+)' not in '([^']+)'", first) or re.match(r"Key '([^']+)' is not in struct", first)
    if m:
        key = full_key or m.group(1)
        obj = getattr(inner, "object_type", None) or _schema_class(
            next(iter(re.findall(r"object_type=(\w+)", text)), m.group(2) if m.lastindex == 2 else "")
        )
        keys = [f.name for f in dataclasses.fields(obj)] if obj and dataclasses.is_dataclass(obj) else []
        where = key.rsplit(".", 1)[0] if "." in key else "the top level"
        hint = f"; allowed keys under {where}: {', '.join(keys)}" if keys else ""
        if where == "hydra.launcher":
            hint = launcher_hint(key.rsplit(".", 1)[1]) + hint
        said = f"unknown config key '{key}'{did_you_mean(key, keys)}{hint}"
        return f"{where_file.group(1)}: {said}" if where_file else said
    if where_file:
        return f"{where_file.group(1)}: {first}"
    if full_key:
        return f"{full_key}: {first}"
    outer = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{outer} {first}".strip() if outer and outer != first else first


@contextmanager
def one_line_errors() -> Iterator[None]:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except ConfigError as exc:
        _die(str(exc), EXIT_BAD_INPUT, exc.more)
    except MissingConfigException as exc:
        _die(format_missing(exc), EXIT_BAD_INPUT)
    except OverrideParseException as exc:
        _die(
            f"cannot parse override {exc.override!r}: quote values that contain spaces or "
            "special characters (key='a b')",
            EXIT_BAD_INPUT,
        )
    except (ConfigCompositionException, OmegaConfBaseException) as exc:
        cause = _innermost(exc)
        if isinstance(cause, ConfigError):
            _die(str(cause), EXIT_BAD_INPUT, cause.more)
        no_match = format_no_match(exc)
        if no_match:
            _die(no_match, EXIT_BAD_INPUT)
        if str(exc).startswith("Ambiguous value for argument"):  # a sweep given to --cfg / --info
            first = str(exc).strip().splitlines()[0].rstrip(".")
            _die(f"{first}: --cfg and --info show one job's config; allowed: one value per key", EXIT_BAD_INPUT)
        _die(format_omegaconf(exc), EXIT_BAD_INPUT)
    except Failed as exc:
        _die(str(exc), EXIT_JOB_FAILED)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)
