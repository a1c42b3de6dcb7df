"""Can this job use its object stores? One line per problem (in the job's environment; boto3).

Run three ways, with the same answers:

- before anything is submitted, by the login side in a subprocess of the job's own Python
  (``python -m hpc_llm.job.rank.store_check '<json>'``; the login process never imports
  boto3): :mod:`hpc_llm.config.stores`;
- from a compute node, by ``hpc-llm doctor``'s probe job (the ``object store`` row);
- at the start of every attempt, by the checkpoint backend (``checkpoint=uri``), before
  Composer touches the store.

For every target (:func:`hpc_llm.config.stores.targets`): the credentials are accepted, the
bucket exists, and then by role: a checkpoint folder can be written (a probe object, put and
deleted) and holds no other run's checkpoints; a data location has the index of every split
the job reads; an object to load from exists. The command prints one line per target,
``ok``/``fail``/``skip``, a tab, and ``<key>=<uri>: <what was found>``; it exits 1 when any failed.
"""

from __future__ import annotations

import json
import secrets
import sys
from typing import Any

from hpc_llm.job.rank import checkpoint_store, object_store
from hpc_llm.job.rank.object_store import STORE_OUTAGE_S, Location, Store

#: codes of a store that refused the credentials themselves
BAD_CREDENTIALS = frozenset({"SignatureDoesNotMatch", "InvalidAccessKeyId", "InvalidToken", "ExpiredToken", "403"})
NO_BUCKET = frozenset({"NoSuchBucket"})


def _where(s3: Any) -> str:
    return str(getattr(getattr(s3, "meta", None), "endpoint_url", None) or "the default S3 endpoint")


def problem_of(exc: BaseException, loc: Location, s3: Any) -> str:
    """One line for what the store answered, with what to do."""
    name = type(exc).__name__
    code = object_store.error_code(exc)
    where = _where(s3)
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return (
            "no credentials for the store: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) where "
            "you submit; the job gets them by name"
        )
    if code in BAD_CREDENTIALS:
        return (
            f"the store at {where} refused the credentials ({code}): check AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, AWS_SESSION_TOKEN)"
        )
    if code == "AccessDenied":
        return f"the credentials may not list s3://{loc.bucket}/{loc.prefix} at {where} (AccessDenied)"
    if code in NO_BUCKET or (code == "404" and not loc.prefix):
        return f"no bucket '{loc.bucket}' at {where}: create it, or name another in the URI"
    if object_store.transient(exc):
        return (
            f"cannot reach the store at {where} ({object_store.describe(exc)}); check S3_ENDPOINT_URL "
            "(or AWS_ENDPOINT_URL) and that the store is up"
        )
    return f"the store at {where} answered {object_store.describe(exc)}"


def _checkpoints(store: Store, loc: Location, target: dict[str, Any]) -> str:
    """The folder can be written, and holds no other run's checkpoints (unless resumed on purpose)."""
    probe = loc.key(f".hpc_llm-write-check-{secrets.token_hex(6)}")
    store.put(probe, b"hpc_llm can write here\n")
    store.delete([probe])
    owner = target.get("owner")
    if not owner:
        return "credentials and bucket fine, writable; a folder of the run's own"
    found = checkpoint_store.owner(store, loc)
    saves = checkpoint_store.saves(store, loc)
    if found is not None and found.get("run") == owner:
        return f"this run's own checkpoints ({len(saves)} save(s))"
    if found is None and not saves:
        return "empty, writable"
    theirs = f"run {found.get('run')!r} (run dir {found.get('run_dir')})" if found else "a run hpc_llm did not record"
    if target.get("resume_other"):
        return f"holds the checkpoints of {theirs}: resumed on purpose (checkpoint.resume_other=true)"
    raise OtherRun(
        f"holds the checkpoints of {theirs}, not this run's; choose another checkpoint.location (or keep "
        "checkpoint.run_subdir=true, a folder per run), or set checkpoint.resume_other=true to resume them on purpose"
    )


class OtherRun(Exception):
    """A checkpoint folder that holds another run's checkpoints."""


def _data(store: Store, loc: Location, target: dict[str, Any]) -> str:
    splits = [s for s in target.get("splits") or [] if s]
    missing = [s for s in splits if store.size(loc.key(f"{s}/index.json")) is None]
    if missing:
        raise OtherRun(
            f"no MDS split '{missing[0]}' there (no {loc.uri(missing[0] + '/index.json')}); write it with "
            f"`hpc-llm data prepare ... --out {loc.uri()}`, or fix the URI"
        )
    if not splits:
        store.list(loc.key() + "/") if loc.prefix else store.list("")
        return "credentials and bucket fine"
    return f"split(s) {', '.join(splits)} found"


def _object(store: Store, loc: Location, target: dict[str, Any]) -> str:
    key = loc.key()
    if store.size(key) is not None or store.size(key + ".symlink") is not None or store.list(key + "/"):
        return "found"
    raise OtherRun(f"no object {loc.uri()} (nor {loc.uri()}.symlink, nor a folder of that name)")


ROLES = {"checkpoint_folder": _checkpoints, "data": _data, "object": _object}


def check_one(target: dict[str, Any], s3: Any) -> tuple[str, str]:
    """(``ok``/``fail``/``skip``, ``<key>=<uri>: <what>``) for one target."""
    key, uri = str(target["key"]), str(target["uri"])
    head = f"{key}={uri!r}"
    try:
        loc = Location.parse(uri)
    except ValueError:
        return "skip", f"{head}: not an s3:// location (not checked)"
    store = Store(loc.bucket, s3)
    try:
        # a request that needs the key, the bucket and the endpoint: the answer says which is wrong
        s3.list_objects_v2(Bucket=loc.bucket, Prefix=loc.key(), MaxKeys=1)
        return "ok", f"{head}: {ROLES[str(target.get('role', 'object'))](store, loc, target)}"
    except OtherRun as exc:
        return "fail", f"{head}: {exc}"
    except Exception as exc:
        return "fail", f"{head}: {problem_of(exc, loc, s3)}"


def check(targets: list[dict[str, Any]], s3: Any | None = None) -> list[tuple[str, str]]:
    """Every target's verdict. Quick to fail: short timeouts, two attempts."""
    if not targets:
        return []
    s3 = s3 if s3 is not None else object_store.client(connect_timeout=5, read_timeout=15, attempts=2)
    return [check_one(t, s3) for t in targets]


def problems(targets: list[dict[str, Any]]) -> list[str]:
    return [line for verdict, line in check(targets) if verdict == "fail"]


def wait_for_store(key: str, folder: str) -> None:
    """At a job's start (rank 0): the checkpoint folder's store check. A store that does not
    answer is waited for (:data:`~hpc_llm.job.rank.object_store.STORE_OUTAGE_S`), then its error
    ends the attempt as transient; a wrong key or a missing bucket is a ConfigError at once."""
    import logging

    from hpc_llm.errors import ConfigError

    target = {"key": key, "uri": folder, "role": "checkpoint_folder"}

    def checked() -> None:
        s3 = object_store.client(connect_timeout=5, read_timeout=20, attempts=2)
        verdict, line = check_one(target, s3)
        if verdict == "fail":
            if "cannot reach the store" in line:
                raise ConnectionError(line)  # transient: waited for
            raise ConfigError(line)

    def waiting(exc: BaseException, wait: float) -> None:
        logging.getLogger(__name__).warning("hpc_llm: %s; trying again in %.0fs", exc, wait)

    object_store.retrying(checked, STORE_OUTAGE_S, on_retry=waiting)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_llm.job.rank.store_check '{\"targets\": [...]}'", file=sys.stderr)
        return 2
    targets = json.loads(args[0])["targets"]
    verdicts = check(targets)
    for verdict, line in verdicts:
        print(f"{verdict}\t{' '.join(line.split())}", flush=True)
    return 1 if any(v == "fail" for v, _ in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
