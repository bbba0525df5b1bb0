"""Which pytest-xdist worker group the root conftest gives a test (``worker_group``), on collected items.

The suite's own conftest is loaded into a small collected tree (pytester), so these are the real hooks
on real items: a module's tests that share a module-scoped fixture stay on one worker (else each worker
that gets one of them starts the fixture again), the others spread, and hil and spark keep their groups.
"""

from __future__ import annotations

import pytest

import conftest as suite

pytest_plugins = ("pytester",)

MODULE = """
import pytest

@pytest.fixture(scope="module")
def started_once():
    return object()

@pytest.fixture
def per_test():
    return object()

def test_shares_the_module_fixture(started_once):
    pass

def test_shares_it_through_a_fixture(per_test, started_once):
    pass

def test_alone(per_test):
    pass

class TestClass:
    def test_in_a_class(self, started_once):
        pass
"""


def groups_of(pytester: pytest.Pytester, path: str, source: str) -> dict[str, str | None]:
    module = pytester.path / path
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(source)
    collected = pytester.inline_run(str(module), "--collect-only", plugins=[suite])
    return {call.item.name: suite.group_of(call.item) for call in collected.getcalls("pytest_itemcollected")}


def test_the_tests_of_a_module_fixture_share_the_modules_group_and_the_rest_spread(pytester: pytest.Pytester) -> None:
    groups = groups_of(pytester, "tests/area/test_shared.py", MODULE)
    assert groups == {
        "test_shares_the_module_fixture": "tests/area/test_shared.py",
        "test_shares_it_through_a_fixture": "tests/area/test_shared.py",
        "test_alone": None,
        "test_in_a_class": "tests/area/test_shared.py",
    }


def test_hil_and_spark_keep_their_groups_whatever_their_fixtures(pytester: pytest.Pytester) -> None:
    spark = MODULE.replace("per_test", "spark")
    assert set(groups_of(pytester, "hil_tests/test_rig.py", MODULE).values()) == {"hil"}
    logic = groups_of(pytester, "hil_tests/tests/test_timeline.py", MODULE)  # no rig, no bound: any worker
    assert logic["test_alone"] is None and logic["test_shares_the_module_fixture"] == "hil_tests/tests/test_timeline.py"
    spark_groups = groups_of(pytester, "tests/area/test_jobs.py", spark)
    assert spark_groups["test_alone"] == spark_groups["test_shares_it_through_a_fixture"] == "spark"
    assert spark_groups["test_shares_the_module_fixture"] == "tests/area/test_jobs.py"


def test_the_groups_go_out_longest_first_then_the_single_tests_slowest_layer_first() -> None:
    work = [(None, "unit"), (None, "process"), ("tests/area/test_shared.py", "process"), (None, "inprocess"),
            ("spark", "process"), ("hil", "hil")]  # fmt: skip
    assert sorted(work, key=lambda unit: suite.send_order(*unit)) == [
        ("hil", "hil"), ("spark", "process"), ("tests/area/test_shared.py", "process"), (None, "process"),
        (None, "inprocess"), (None, "unit"),
    ]  # fmt: skip


def test_pytest_xdist_keeps_that_order_instead_of_sorting_the_groups_by_size(pytester: pytest.Pytester) -> None:
    pytester.plugins.append(suite)
    config = pytester.parseconfigure("--dist", "loadgroup")
    assert config.option.loadscopereorder is False
