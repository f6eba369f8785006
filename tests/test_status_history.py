"""The status page's history (server/core/status_history.py): quantiles from histogram buckets as
Prometheus' histogram_quantile computes them, and per-interval rates and shares per tier; the
store's log of default-version changes behind the default-history plot."""

from __future__ import annotations

import pytest
from harmony_mobile.server.core.status_history import MetricHistory, Sample, quantile
from harmony_mobile.server.services.store import Store


def test_quantile_interpolates_inside_the_bucket_like_prometheus():
    buckets = {0.01: 50.0, 0.1: 90.0, 1.0: 100.0, float("inf"): 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.7, buckets) == pytest.approx(0.01 + 0.09 * 20 / 40)
    assert quantile(0.99, buckets) == pytest.approx(0.1 + 0.9 * 9 / 10)
    assert quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert quantile(0.99, {0.1: 1.0, float("inf"): 10.0}) == 0.1  # above the last finite bound


def test_intervals_give_rows_per_second_share_and_latency_per_tier():
    history = MetricHistory(keep=3)  # three intervals: the first sample below is dropped
    history.add(Sample(90.0, {}, {}))
    history.add(Sample(100.0, {"a": 10.0}, {"a": {0.01: 0.0, float("inf"): 0.0}}))
    history.add(Sample(110.0, {"a": 40.0, "b": 10.0}, {"a": {0.01: 10.0, float("inf"): 10.0}}))
    history.add(Sample(120.0, {"a": 40.0, "b": 10.0}, {"a": {0.01: 10.0, float("inf"): 10.0}}))
    history.add(Sample(130.0, {"a": 41.0, "b": 13.0}, {"a": {0.01: 10.0, float("inf"): 10.0}}))
    first, idle, last = history.intervals()
    assert first.rows_per_second == {"a": 3.0, "b": 1.0} and first.share == {"a": 0.75, "b": 0.25}
    assert first.p50["a"] == pytest.approx(0.005) and first.p99["a"] == pytest.approx(0.0099)
    assert idle.share == {} and idle.p99 == {}  # nothing happened: no share, no latency
    assert last.share == {"a": 0.25, "b": 0.75}


def test_every_change_of_the_default_version_is_logged(tmp_path):
    store = Store(tmp_path)
    try:
        for version in ("v1", "v1", "v2", "v1"):  # publish v1, set it again, v2, roll back to v1
            store.set_default_version(version)
        assert [v for _, v in store.default_history()] == ["v1", "v2", "v1"]
    finally:
        store.close()
