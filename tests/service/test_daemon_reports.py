"""What the running daemon reports: a journal event for every refused request and every
grant (its decision level kept), an NVL72 tray's NVLink domain in the API and /metrics,
link bandwidth and probe figures in /metrics while links are probed, and telemetry
(the README's example) folded into the links."""

from __future__ import annotations

import pytest

from tests.service.daemon_scenario import _wait_until, check_metrics, live_profile, scenarios, scrape_metrics


@pytest.fixture()
def scenario(daemon_factory, tmp_path):
    yield from scenarios(daemon_factory, tmp_path)


def test_every_refused_request_is_a_journal_event_with_its_reason(scenario):
    from topod.client import ApiError

    s = scenario()
    with pytest.raises(ApiError) as refused:
        s.client.allocate(9, job="too-big")
    assert refused.value.code == "insufficient_gpus"
    # The log line is rendered once the answer is out (topod.events): it follows shortly.
    assert _wait_until(lambda: "request_rejected" in s.daemon.log()), s.daemon.log()
    line = next(l for l in s.daemon.log().splitlines() if "request_rejected" in l)
    assert "code=insufficient_gpus" in line and "job=too-big" in line and "result=rejected" in line
    s.check()


def test_a_grant_is_a_log_line_that_keeps_its_decision_level(scenario):
    """lease_granted carries the decision's level; the log's own `level` (info) must not
    overwrite it: it is logged as event_level."""
    s = scenario()
    lease = s.allocate(1)
    assert _wait_until(lambda: "lease_granted" in s.daemon.log()), s.daemon.log()
    line = next(l for l in s.daemon.log().splitlines() if "lease_granted" in l)
    assert f"event_level={lease['decision']['level']}" in line and f"lease={lease['id']}" in line, line
    s.check()


def test_an_nvl72_tray_shows_its_nvlink_domain_in_the_api_and_metrics(daemon_factory):
    daemon = daemon_factory("gb200-nvl72-tray0", config=None)
    client = daemon.start()
    domain = client.topology()["nvlink_domain"]
    assert domain and domain["cluster_uuid"] and domain["clique_ids"]
    _, text = scrape_metrics(daemon.socket)
    line = next(l for l in text.splitlines() if l.startswith("topod_nvlink_domain_info"))
    assert domain["cluster_uuid"] in line and f'clique_id="{domain["clique_ids"][0]}"' in line


def test_the_readmes_telemetry_example_is_taken_on_the_default_backend(scenario):
    s = scenario()
    # the probe's setup may still run after READY: it says "starting" (503) meanwhile
    assert _wait_until(lambda: not s.client.request("GET", "/v1/links").get("starting"))
    answer = s.client.request("POST", "/v1/telemetry", {"link": "p2p/gpu0/gpu1", "bytes": 268435456,
                                                        "seconds": 0.011})
    assert answer["folded"] is True and answer["bandwidth_gbps"] > 20
    links = s.client.request("GET", "/v1/links")
    assert any("p2p" in str(row.get("link")) for row in links["links"])
    s.check()


def test_live_profile_metrics_answer_while_links_are_probed(scenario):
    s = scenario(host="pcie-8gpu", config=live_profile())
    links = _wait_until(lambda: (a := s.client.request("GET", "/v1/links"))["enabled"] and
                        any(row["measured_gbps"] for row in a["links"]) and a, timeout=20)
    assert links, s.client.request("GET", "/v1/links")
    text = check_metrics(s.daemon.socket)
    assert "topod_link_bandwidth_bytes_per_second{" in text, text[-2000:]
    assert "topod_probe_duration_seconds" in text
    s.check()
