"""Shared fixtures: small datasets on disk."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from support import write_text_parquet

# Property tests draw as many examples as the profile says, not each its own number: the quick loop ("quick":
# `pytest -m "not slow"`, any -m) 25 a test, the whole suite ("thorough": plain `python -m pytest`, the README's
# command that CI runs) 150; `--hypothesis-profile NAME` chooses either. A test whose every example starts
# processes or a server keeps a smaller pin of its own. No deadline: a loaded shared machine is no reason to fail
# a property.
settings.register_profile("quick", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", settings.get_profile("quick"), max_examples=150)
settings.load_profile("quick")


def pytest_configure(config) -> None:
    """Load the thorough profile for the whole suite (no ``-m`` and no ``--hypothesis-profile``)."""
    if not config.option.markexpr and config.getoption("hypothesis_profile", None) is None:
        settings.load_profile("thorough")

# Progress lines start after SORTPACK_PROGRESS_DELAY seconds of a stage: on a loaded machine a stage
# can pass the default 2 s, and a test counting stderr lines then counts progress too. Every
# process a test starts (and every in-process stage) inherits this; the tests of progress itself
# set their own delay (0).
PROGRESS_DELAY = "3600"
os.environ["SORTPACK_PROGRESS_DELAY"] = PROGRESS_DELAY
# The proven tokenizer conversions the tests' jobs keep (inputs/conversion_cache.py) go to a folder of this run's
# own, never to the user's ~/.cache; every process a test starts inherits it. The workers of one `-n` run share
# one (xdist gives them the run's id): an entry is written atomically, and each file is converted once, not per
# worker.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if _RUN and _RUN.isalnum():
    os.environ["SORTPACK_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"sortpack-test-cache-{_RUN}")
    os.makedirs(os.environ["SORTPACK_CACHE_DIR"], exist_ok=True)
else:
    os.environ["SORTPACK_CACHE_DIR"] = tempfile.mkdtemp(prefix="sortpack-test-cache-")


@pytest.fixture
def text_dataset(tmp_path) -> tuple[list[Path], np.ndarray]:
    """Three parquet files of random-length text (3 x 700 rows, row groups of 250)."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 300, size=2100)
    files = []
    for k in range(3):
        files.append(write_text_parquet(tmp_path / f"part-{k}.parquet", lengths[k * 700:(k + 1) * 700], 250))
    return files, lengths


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 for the whole session (tests/object_store.py), with credentials checked."""
    from object_store import start_server, stop_server

    server = start_server()
    yield server
    stop_server(server)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Point this process's object-store reads at the session's moto server; return the server."""
    from sortpack.inputs import objects

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    objects._filesystem.cache_clear()
    objects._SMALL.clear()  # a later test may put other bytes under the same URL
    yield s3_server
    objects._filesystem.cache_clear()
    objects._SMALL.clear()
