"""A real S3-compatible server on loopback for tests: moto's standalone server behind a proxy.

The proxy (``fault_proxy.FaultProxy``) records every request and the bytes answered, so a test
can count ranged reads, and injects faults when asked. Clients talk to the proxy; the
``direct_endpoint_url`` skips it (for setup that should neither be counted nor broken).
Nothing here talks to anything but 127.0.0.1, and no real AWS credentials or config are read.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import s3fs
from fault_proxy import FaultProxy
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
KEY = SECRET = "testing"

# Variables that could point a client at real credentials, config, a profile or a proxy.
_AWS_VARS_TO_DROP = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


def isolated_aws_env(endpoint_url: str, scratch: Path) -> dict[str, str | None]:
    """The environment changes that keep boto/s3fs on the test server (None = unset).

    The endpoint variable also steers child processes (converter subprocess, torchrun ranks)
    that build their own client without ``storage_options``.
    """
    missing = str(scratch / "no-such-aws-file")
    env: dict[str, str | None] = dict.fromkeys(_AWS_VARS_TO_DROP)
    env.update(
        AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_CONFIG_FILE=missing,
        AWS_SHARED_CREDENTIALS_FILE=missing,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL=endpoint_url,
        AWS_ENDPOINT_URL_S3=endpoint_url,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


def apply_env(base: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    """``base`` with ``changes`` applied: the environment for a child process."""
    env = dict(base)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def storage_options(endpoint_url: str) -> dict[str, Any]:
    """fsspec ``storage_options`` for s3fs against ``endpoint_url`` with the test keys."""
    return {
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": endpoint_url, "region_name": REGION},
    }


@dataclass
class S3Server:
    """A running moto server and the recording/fault proxy in front of it."""

    moto: ThreadedMotoServer
    proxy: FaultProxy
    direct_endpoint_url: str
    _names: dict[str, Iterator[int]] = field(default_factory=dict)

    @property
    def endpoint_url(self) -> str:
        """Where clients should connect: through the proxy."""
        return self.proxy.endpoint_url

    @property
    def storage_options(self) -> dict[str, Any]:
        return storage_options(self.endpoint_url)

    @property
    def direct_storage_options(self) -> dict[str, Any]:
        return storage_options(self.direct_endpoint_url)

    @functools.cached_property
    def direct_filesystem(self) -> s3fs.S3FileSystem:
        """One shared client that skips the proxy: for setup, never counted nor broken."""
        return self.filesystem(direct=True)

    def filesystem(self, *, direct: bool = False) -> s3fs.S3FileSystem:
        """A fresh (uncached) s3fs client, through the proxy unless ``direct``."""
        opts = self.direct_storage_options if direct else self.storage_options
        return s3fs.S3FileSystem(skip_instance_cache=True, **opts)

    def new_bucket(self, prefix: str = "bucket") -> str:
        """Create a bucket no test has used and return its name, ``<prefix>-<n>``.

        ``n`` counts per prefix, so a module that asks for its own prefix gets the same name
        whichever tests ran before (fault draws hash the request path, bucket included).
        """
        n = self._names.setdefault(prefix, itertools.count())
        name = f"{prefix}-{next(n)}"
        # Not fs.mkdir: it sends a LocationConstraint of us-east-1, which S3 rejects.
        self.direct_filesystem.call_s3("create_bucket", Bucket=name)
        return name


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """Start moto on a free loopback port with a proxy in front; stop both on exit."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        direct = f"http://{host}:{port}"
        with FaultProxy(direct) as proxy:
            yield S3Server(moto=moto, proxy=proxy, direct_endpoint_url=direct)
    finally:
        moto.stop()


@dataclass(frozen=True)
class S3Bucket:
    """One test's fresh bucket on the shared server."""

    server: S3Server
    name: str

    def url(self, *parts: str) -> str:
        """``s3://<bucket>/<parts...>``."""
        return "/".join((f"s3://{self.name}", *parts))

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.server.storage_options

    @property
    def proxy(self) -> FaultProxy:
        return self.server.proxy
