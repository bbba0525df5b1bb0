"""The one Prometheus exposition: what it writes is read back exactly by the reference parser
(prometheus_client's), whatever the label values hold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from appliance.prometheus import Family, counter, gauge, render


def parsed(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


@given(st.text(max_size=40), st.text(max_size=40), st.integers(0, 2**53))
def test_any_label_value_and_help_text_survive_the_reference_parser(value: str, help_text: str, number: int) -> None:
    text = render([counter("gateway_things_total", help_text, number, endpoint=value), gauge("gateway_up", "up", 1)])
    assert parsed(text) == {"gateway_things_total": [({"endpoint": value}, number)], "gateway_up": [({}, 1)]}


def test_families_from_several_sources_share_one_header() -> None:
    text = render([gauge("gateway_link_connected", "connected", 1, endpoint="a"),
                   gauge("gateway_link_connected", "connected", 0, endpoint="b")])
    assert text.count("# TYPE gateway_link_connected gauge") == 1
    assert parsed(text)["gateway_link_connected"] == [({"endpoint": "a"}, 1), ({"endpoint": "b"}, 0)]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Family("bad-name", "gauge", "x"), "invalid metric name"),
        (lambda: Family("gateway_sent", "counter", "x"), "must end in _total"),
        (lambda: gauge("gateway_x", "x", 1, **{"__reserved": "v"}), "invalid label name"),
        (lambda: render([gauge("gateway_x", "x", 1), counter("gateway_x_total", "x", 1), gauge("gateway_x_total", "x", 1)]),
         "both a counter and a gauge"),
    ],
)
def test_what_prometheus_would_refuse_is_an_error_here(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_nothing_to_say_is_an_empty_page_and_numbers_keep_their_form() -> None:
    assert render([]) == ""
    assert "gateway_rate 0.5\n" in render([gauge("gateway_rate", "r", 0.5)])
    assert "gateway_rate 3\n" in render([gauge("gateway_rate", "r", 3.0)])
