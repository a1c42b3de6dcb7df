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

from hpc_llm.errors import ConfigError, Failed, allowed

EXIT_BAD_INPUT = 2
EXIT_JOB_FAILED = 1


def _die(message: str, code: int) -> None:
    sys.stderr.write(f"hpc_llm: error: {' '.join(message.split())}\n")
    sys.stderr.flush()
    raise SystemExit(code)


def format_missing(exc: MissingConfigException) -> str:
    missing = exc.missing_cfg_file or ""
    options = exc.options or []
    if "/" in missing:
        group, name = missing.rsplit("/", 1)
        return f"unknown {group} '{name}'; allowed: {allowed(options)}"
    first = str(exc).strip().splitlines()[0]
    return f"{first}; allowed: {allowed(options)}" if options else first


def _innermost(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def format_omegaconf(exc: BaseException) -> str:
    inner = _innermost(exc)
    full_key = getattr(inner, "full_key", None)
    first = str(inner).strip().splitlines()[0] if str(inner).strip() else type(inner).__name__
    m = re.match(r"Key '([^']+)' not in '([^']+)'", first) or re.match(r"Key '([^']+)' is not in struct", first)
    if m:
        key = full_key or m.group(1)
        obj = getattr(inner, "object_type", None)
        keys = [f.name for f in dataclasses.fields(obj)] if obj and dataclasses.is_dataclass(obj) else []
        where = key.rsplit(".", 1)[0] if "." in key else "the top level"
        hint = f"; allowed keys under {where}: {', '.join(keys)}" if keys else ""
        return f"unknown config key '{key}'{hint}"
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
        _die(str(exc), EXIT_BAD_INPUT)
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
            _die(str(cause), EXIT_BAD_INPUT)
        _die(format_omegaconf(exc), EXIT_BAD_INPUT)
    except Failed as exc:
        _die(str(exc), EXIT_JOB_FAILED)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)
