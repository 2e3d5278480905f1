"""Reading a `/metrics` page into {sample name: {labels: value}} for assertions."""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from polar_mq.infra.tls import client_ssl_context

Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def scrape(url: str) -> Samples:
    response = httpx.get(url, timeout=10, verify=client_ssl_context())
    response.raise_for_status()
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[sample.name][frozenset(sample.labels.items())] = sample.value
    return dict(out)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for key, v in samples.get(name, {}).items() if wanted <= key)
