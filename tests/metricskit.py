"""Reading a real worker's ``/metrics`` in tests: every sample by name, and one series by its labels."""

from __future__ import annotations

import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    """Every sample of a worker's ``/metrics``, by sample name (counters with their ``_total``)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels``; None when there is none."""
    found = [v for ls, v in samples.get(name, []) if all(ls.get(k) == x for k, x in labels.items())]
    assert len(found) <= 1, f"{name}{labels} has {len(found)} series"
    return found[0] if found else None
