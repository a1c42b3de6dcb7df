"""The S3 store a run keeps its checkpoints in (in-job; boto3, imported lazily).

Composer writes checkpoints to a store and reads them back, but its ``ObjectStore`` has no
delete, and what hpc_llm adds around a run's checkpoints (keep-last-K, setting an unfinished
save aside, linking ``latest`` when a stop's upload is done, whose checkpoints a folder holds)
needs one. This is that, for S3 and S3-compatible stores (SeaweedFS on the dev cluster).

The client is configured as Composer's S3 store and Streaming's downloader configure theirs:
the endpoint from ``S3_ENDPOINT_URL`` when set (boto3 also reads ``AWS_ENDPOINT_URL`` on its
own), the credentials, region and profile by boto3's own rules.

**Every write** (an upload, a copy, a delete) goes through :meth:`Store._write_allowed`: a
rank of a generation that is no longer live must not write a checkpoint, a ``latest`` link or
delete anything (the generation fence hooks there).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

#: botocore error codes and exception names of a store that is down, slow or overloaded:
#: worth retrying; anything else (a wrong key, a missing bucket) is not
TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed", "500", "502", "503"}
)
TRANSIENT_EXCEPTIONS = frozenset(
    {
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionError",
        "ProxyConnectionError",
        "ResponseStreamingError",
        "IncompleteReadError",
    }
)

T = TypeVar("T")

#: how long the start of an attempt, a background upload and a stop's link wait for a store that
#: is down or frozen before giving up (then the attempt fails as ``transient``: the supervisor
#: restarts it after a wait, from the last linked checkpoint)
STORE_OUTAGE_S = 600.0


@dataclass(frozen=True)
class Location:
    """``s3://bucket/prefix``."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> Location:
        scheme, sep, rest = str(uri).partition("://")
        if scheme != "s3" or not sep or not rest.split("/", 1)[0]:
            raise ValueError(f"not an s3:// URI: {uri!r}")
        bucket, _, prefix = rest.partition("/")
        return cls(bucket, prefix.strip("/"))

    def key(self, name: str = "") -> str:
        """The object key of ``name`` under the prefix."""
        return "/".join(p for p in (self.prefix, name.lstrip("/")) if p)

    def uri(self, name: str = "") -> str:
        return f"s3://{self.bucket}/{self.key(name)}".rstrip("/")


def endpoint_url() -> str | None:
    """The endpoint Composer and Streaming use: ``S3_ENDPOINT_URL``; else None (boto3's own)."""
    return os.environ.get("S3_ENDPOINT_URL") or None


def client(connect_timeout: float = 10, read_timeout: float = 60, attempts: int = 3) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"mode": "standard", "max_attempts": attempts},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url(), config=config)


def error_code(exc: BaseException) -> str:
    """The store's error code (``NoSuchBucket``, ``SignatureDoesNotMatch``, ``404``), or the
    exception's class name for errors below HTTP (``EndpointConnectionError``)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        if code:
            return str(code)
    return type(exc).__name__


def transient(exc: BaseException) -> bool:
    """A store that is down, frozen, slow or overloaded, as opposed to a wrong key or bucket
    (also behind a wrapper: boto3's upload_file raises S3UploadFailedError from the ClientError)."""
    return any(error_code(e) in TRANSIENT_CODES or error_code(e) in TRANSIENT_EXCEPTIONS for e in _chain(exc))


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        yield e
        e, seen = e.__cause__ or e.__context__, seen + 1


def describe(exc: BaseException) -> str:
    """One line: the error code and the store's message."""
    text = " ".join(str(exc).split())
    return f"{error_code(exc)}: {text}" if error_code(exc) not in text else text


def retrying(
    what: Callable[[], T],
    deadline_s: float,
    on_retry: Callable[[BaseException, float], None] | None = None,
    first_wait_s: float = 1.0,
    max_wait_s: float = 30.0,
) -> T:
    """``what()`` again while the store's errors are transient, with doubling waits, for up to
    ``deadline_s``: a store killed or frozen for a minute or two must not fail a run. Raises the
    last error then, or at once for an error that is not transient."""
    deadline = time.monotonic() + deadline_s
    wait = first_wait_s
    while True:
        try:
            return what()
        except Exception as exc:
            if not transient(exc) or time.monotonic() + wait > deadline:
                raise
            if on_retry is not None:
                on_retry(exc, wait)
            time.sleep(wait)
            wait = min(max_wait_s, wait * 2)


class Store:
    """One bucket of an S3 store."""

    def __init__(self, bucket: str, s3: Any | None = None) -> None:
        self.bucket = bucket
        self.s3 = s3 if s3 is not None else client()

    @classmethod
    def of(cls, uri: str, s3: Any | None = None) -> tuple[Store, Location]:
        loc = Location.parse(uri)
        return cls(loc.bucket, s3), loc

    # -- reads ----------------------------------------------------------------------------
    def list(self, prefix: str) -> dict[str, int]:
        """key -> size of every object under ``prefix`` (a folder: give it a trailing slash)."""
        out: dict[str, int] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents") or []:
                out[obj["Key"]] = int(obj["Size"])
        return out

    def read(self, key: str) -> bytes | None:
        """The object's bytes; None when there is none."""
        try:
            return bytes(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404"):
                return None
            raise

    def size(self, key: str) -> int | None:
        try:
            return int(self.s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    # -- writes: every one passes _write_allowed ---------------------------------------------
    def _write_allowed(self, what: str) -> None:
        """The one gate every write to the store passes (uploads, copies, deletes): a rank whose
        generation is no longer live must write nothing (:func:`hpc_llm.job.rank.fence.check`,
        which also works in the upload workers a rank spawns)."""
        from hpc_llm.job.rank import fence

        fence.check(what)

    def put(self, key: str, data: bytes | Path) -> None:
        """Upload bytes or a file (multipart for a large one)."""
        self._write_allowed(f"upload {key}")
        if isinstance(data, bytes):
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        else:
            from boto3.s3.transfer import TransferConfig

            self.s3.upload_file(str(data), self.bucket, key, Config=TransferConfig())

    def copy(self, src: str, dst: str) -> None:
        self._write_allowed(f"copy {src} to {dst}")
        self.s3.copy_object(Bucket=self.bucket, Key=dst, CopySource={"Bucket": self.bucket, "Key": src})

    def delete(self, keys: Iterable[str]) -> None:
        batch = sorted(set(keys))
        if not batch:
            return
        self._write_allowed(f"delete {len(batch)} object(s)")
        for i in range(0, len(batch), 1000):  # DeleteObjects takes at most 1000 keys
            objects = [{"Key": k} for k in batch[i : i + 1000]]
            answer = self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise OSError(f"s3://{self.bucket}/{first.get('Key')}: not deleted ({first.get('Code')})")

    def move(self, src: str, dst: str) -> None:
        self.copy(src, dst)
        self.delete([src])
