"""pytest fixtures for the S3 API on loopback; import them into a test module or a conftest.

``moto_endpoint`` is one moto server for the session; ``s3_bucket`` gives every test a fresh
bucket of its own (so tests never see each other's objects); ``fault_proxy`` puts a
:class:`~tests.support.s3.FaultProxy` in front of moto. Everything started is stopped and
every client closed at teardown, as ``filterwarnings = error`` demands.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fault_proxy import FaultProxy
from tests.support.s3 import moto_server, s3_client

_buckets = itertools.count()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """The endpoint URL of a moto S3 server that lives for the whole session."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> Iterator[tuple[Any, str]]:
    """(a client talking to moto directly, a fresh empty bucket with a unique name)."""
    client = s3_client(moto_endpoint)
    name = f"test-{os.getpid()}-{next(_buckets)}"
    client.create_bucket(Bucket=name)
    try:
        yield client, name
    finally:
        client.close()


@pytest.fixture
def fault_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's moto server."""
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy
