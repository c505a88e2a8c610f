"""The simulator's /metrics exporter over HTTP, without Prometheus: pages, targets, errors."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.sim import samples as s
from serving.sim.exporter import CONTENT_TYPE_TEXT_004, ExporterError, SimMetricsExporter
from tests.support.sim_samples import INSTANCE_IDS, TTFT_S, synthetic_samples

OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture
def exporter() -> Iterator[SimMetricsExporter]:
    with SimMetricsExporter(model_names={"default": "llama3-8b"}) as exp:
        exp.update(synthetic_samples(10.0))
        yield exp


def get(url: str, accept: str = OPENMETRICS_ACCEPT) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def samples_by_name(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def test_instance_page_keeps_vllm_colons_even_when_openmetrics_is_asked(exporter: SimMetricsExporter) -> None:
    status, ctype, text = get(f"{exporter.url}/instances/{INSTANCE_IDS[1]}/metrics")
    assert status == 200
    assert ctype == CONTENT_TYPE_TEXT_004
    got = samples_by_name(text)
    [(labels, value)] = got[s.NUM_REQUESTS_RUNNING]
    assert value == 5.0
    assert labels == {
        "model_name": "llama3-8b",
        "engine": "0",
        "instance_id": INSTANCE_IDS[1],
        "pool": "default",
        "role": "decode",
        "node": "node-1",
    }
    [(_, prompt)] = got[s.PROMPT_TOKENS_TOTAL]
    assert prompt == 1000.0 * 10.0 * 2
    assert "vllm_num_requests_running" not in text
    assert not any(name.endswith("_created") for name in got)


def test_histogram_buckets_are_cumulative_with_inf_count_and_sum(exporter: SimMetricsExporter) -> None:
    text = exporter.render(INSTANCE_IDS[0]).decode()
    got = samples_by_name(text)
    buckets = {lab["le"]: v for lab, v in got[s.TIME_TO_FIRST_TOKEN_SECONDS + "_bucket"]}
    assert len(buckets) == len(s.TTFT_BUCKETS_S) + 1
    assert buckets["0.1"] == 0.0
    assert buckets["0.25"] == 100.0
    assert buckets["+Inf"] == 100.0
    [(_, count)] = got[s.TIME_TO_FIRST_TOKEN_SECONDS + "_count"]
    [(_, total)] = got[s.TIME_TO_FIRST_TOKEN_SECONDS + "_sum"]
    assert count == 100.0
    assert total == pytest.approx(100.0 * TTFT_S)


def test_fleet_page_has_every_serving_instance_and_drops_nan_gauges(exporter: SimMetricsExporter) -> None:
    exporter.update(synthetic_samples(10.0, running=(1.0, float("nan"), 2.0), states=("active",) * 3))
    got = samples_by_name(get(f"{exporter.url}/metrics")[2])
    running = {lab["instance_id"]: v for lab, v in got[s.NUM_REQUESTS_RUNNING]}
    assert running == {INSTANCE_IDS[0]: 1.0, INSTANCE_IDS[2]: 2.0}
    assert {lab["instance_id"] for lab, _ in got[s.PROMPT_TOKENS_TOTAL]} == set(INSTANCE_IDS)


def test_provisioning_instance_answers_503_and_unknown_404(exporter: SimMetricsExporter) -> None:
    status, _, body = get(f"{exporter.url}/instances/{INSTANCE_IDS[2]}/metrics")
    assert (status, "provisioning" in body) == (503, True)
    assert get(f"{exporter.url}/instances/nope/metrics")[0] == 404
    assert get(f"{exporter.url}/other")[0] == 404
    fleet = samples_by_name(get(f"{exporter.url}/metrics")[2])
    assert INSTANCE_IDS[2] not in {lab["instance_id"] for lab, _ in fleet[s.PROMPT_TOKENS_TOTAL]}


def test_targets_json_is_file_sd_with_one_group_per_instance(exporter: SimMetricsExporter) -> None:
    status, ctype, body = get(exporter.targets_url, accept="application/json")
    assert (status, ctype) == (200, "application/json")
    groups = json.loads(body)
    assert [g["labels"]["instance_id"] for g in groups] == list(INSTANCE_IDS)
    first = groups[0]
    assert first["targets"] == [f"127.0.0.1:{exporter.port}"]
    assert first["labels"]["__metrics_path__"] == f"/instances/{INSTANCE_IDS[0]}/metrics"
    assert first["labels"]["instance"] == INSTANCE_IDS[0]
    assert (first["labels"]["pool"], first["labels"]["role"]) == ("default", "prefill")


def test_update_swaps_the_snapshot(exporter: SimMetricsExporter) -> None:
    exporter.update(synthetic_samples(20.0))
    assert exporter.now_s == 20.0
    got = samples_by_name(exporter.render(INSTANCE_IDS[0]).decode())
    assert got[s.PROMPT_TOKENS_TOTAL][0][1] == 20_000.0


def test_update_rejects_misaligned_samples_naming_the_field(exporter: SimMetricsExporter) -> None:
    good = synthetic_samples(1.0)
    bad = s.InstanceSamples(
        now_s=1.0,
        instance_ids=good.instance_ids,
        pools=good.pools,
        roles=good.roles,
        nodes=good.nodes,
        states=good.states,
        gauges={s.NUM_REQUESTS_RUNNING: np.zeros(2)},
    )
    with pytest.raises(ExporterError, match=r"gauges\['vllm:num_requests_running'\] has shape \(2,\)"):
        exporter.update(bad)
    assert exporter.now_s == 10.0, "a rejected update leaves the old snapshot published"
