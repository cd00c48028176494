"""Fixtures for trainables tests: a real S3-compatible server (moto) on loopback.

`s3` starts one `moto.server.ThreadedMotoServer` per module, points the AWS variables at it
(credentials, region, AWS_ENDPOINT_URL) and the download cache at a temp folder, and yields an
`S3` with the endpoint and a fresh bucket maker. Nothing is mocked: pyarrow talks HTTP to it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest


@dataclass
class S3:
    """The running server: its endpoint URL, and `bucket()` to create a fresh bucket."""

    endpoint: str
    _n: itertools.count = field(default_factory=itertools.count)

    def bucket(self, prefix: str = "lsw") -> str:
        """Create a new bucket; returns its s3:// URI."""
        import boto3

        name = f"{prefix}-{next(self._n)}"
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return f"s3://{name}"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 and the environment that points pyarrow and boto3 at it.

    Module-scoped so a Ray started after it (its raylet and workers inherit the environment
    at start) writes to the same server.
    """
    moto_server = pytest.importorskip("moto.server", reason="pip install 'moto[server]'")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    cache = tmp_path_factory.mktemp("storage-cache")
    with pytest.MonkeyPatch.context() as mp:
        for var, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata probing for credentials
            "AWS_CONFIG_FILE": str(cache / "no-aws-config"),  # the user's ~/.aws is not read
            "AWS_SHARED_CREDENTIALS_FILE": str(cache / "no-aws-credentials"),
            "LAYERSWAP_CACHE": str(cache / "cache"),
        }.items():
            mp.setenv(var, value)
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(var, raising=False)
        yield S3(endpoint)
    server.stop()
