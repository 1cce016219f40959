"""One sample from a component's Prometheus ``/metrics``, read the way the scenarios check a gauge."""

from __future__ import annotations

import requests


def sample(url: str, series: str) -> float | None:
    """The value of ``series`` (name and labels, exactly as exposed) at ``url``; None while the
    endpoint does not answer or does not expose it."""
    try:
        text = requests.get(url, timeout=5).text
    except requests.RequestException:
        return None
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    return None
