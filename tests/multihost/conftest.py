"""The multi-host tests need root and `ip`/`tc` (network namespaces); skip them elsewhere."""

from __future__ import annotations

import pytest

from polar_mq.testing.netns_bed import NetnsBed


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if NetnsBed.available():
        return
    skip = pytest.mark.skip(reason="needs root and iproute2 (network namespaces)")
    for item in items:
        if "tests/multihost/" in item.nodeid:
            item.add_marker(skip)
