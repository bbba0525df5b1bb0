"""Which pytest-xdist worker group the root conftest gives a test (``worker_group``), on collected items.

The suite's own conftest is loaded into a small collected tree (pytester), so these are the real hooks
on real items: a module's tests that share a module-scoped fixture stay on one worker (else each worker
that gets one of them starts the fixture again), the others spread, and the hil groups and spark keep
theirs. The hil layer's two groups run side by side because the rig's own tests never touch the bench the
scenarios share: that is checked on the source of every rig test module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import conftest as suite

REPO_ROOT = Path(suite.__file__).parent

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
    assert set(groups_of(pytester, "hil_tests/rig/tests/test_link.py", MODULE).values()) == {"hil-rig"}
    assert set(groups_of(pytester, "hil_tests/scenarios/test_outage.py", MODULE).values()) == {"hil-scenarios"}
    assert set(groups_of(pytester, "hil_tests/tests/test_a_bench.py", MODULE).values()) == {"hil-scenarios"}
    logic = groups_of(pytester, "hil_tests/tests/test_timeline.py", MODULE)  # no rig, no bound: any worker
    assert logic["test_alone"] is None and logic["test_shares_the_module_fixture"] == "hil_tests/tests/test_timeline.py"
    spark_groups = groups_of(pytester, "tests/area/test_jobs.py", spark)
    assert spark_groups["test_alone"] == spark_groups["test_shares_it_through_a_fixture"] == "spark"
    assert spark_groups["test_shares_the_module_fixture"] == "tests/area/test_jobs.py"


SPARK_MODULE = """
import pytest

@pytest.fixture(scope="session")
def spark():
    return object()

@pytest.fixture
def batch_outputs(spark):
    return spark

def test_takes_spark(spark):
    pass

def test_takes_it_through_a_fixture(batch_outputs):
    pass

@pytest.mark.slow
def test_slow_and_spark(batch_outputs):
    pass

def test_no_spark(tmp_path):
    pass
"""


def test_a_test_that_takes_spark_directly_or_through_a_fixture_is_marked_spark_at_collection(pytester: pytest.Pytester) -> None:
    module = pytester.path / "tests/area/test_jobs.py"
    module.parent.mkdir(parents=True)
    module.write_text(SPARK_MODULE)
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n    spark: takes spark\n")
    collected = pytester.inline_run(str(module), "--collect-only", "--strict-markers", plugins=[suite])
    marked = {call.item.name: call.item.get_closest_marker("spark") is not None
              for call in collected.getcalls("pytest_itemcollected")}
    assert marked == {"test_takes_spark": True, "test_takes_it_through_a_fixture": True, "test_slow_and_spark": True,
                      "test_no_spark": False}
    deselected = pytester.inline_run(str(module), "--collect-only", "-m", "not spark", plugins=[suite])
    assert [item.name for call in deselected.getcalls("pytest_deselected") for item in call.items] == [
        "test_takes_spark", "test_takes_it_through_a_fixture", "test_slow_and_spark"]


def test_the_groups_go_out_longest_first_then_the_single_tests_slowest_layer_first() -> None:
    work = [(None, "unit"), (None, "process"), ("tests/area/test_shared.py", "process"), (None, "inprocess"),
            ("spark", "process"), ("hil-scenarios", "hil"), ("hil-rig", "hil")]  # fmt: skip
    assert sorted(work, key=lambda unit: suite.send_order(*unit)) == [
        ("hil-rig", "hil"), ("hil-scenarios", "hil"), ("spark", "process"), ("tests/area/test_shared.py", "process"),
        (None, "process"), (None, "inprocess"), (None, "unit"),
    ]  # fmt: skip


def test_pytest_xdist_keeps_that_order_instead_of_sorting_the_groups_by_size(pytester: pytest.Pytester) -> None:
    pytester.plugins.append(suite)
    config = pytester.parseconfigure("--dist", "loadgroup")
    assert config.option.loadscopereorder is False


def _fixtures_defined(tree: ast.Module) -> set[str]:
    """The names of the functions of ``tree`` decorated ``@pytest.fixture`` (with or without arguments)."""
    def is_fixture(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return isinstance(target, ast.Attribute) and target.attr == "fixture"

    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(map(is_fixture, node.decorator_list))}


def _fixtures_requested(tree: ast.Module) -> set[str]:
    """What the tests and fixtures of ``tree`` ask for: their parameters and ``getfixturevalue("name")``."""
    requested = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (node.name.startswith("test") or node.decorator_list):
            requested |= {argument.arg for argument in node.args.args}
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getfixturevalue"
                and node.args and isinstance(node.args[0], ast.Constant)):
            requested.add(str(node.args[0].value))
    return requested


def test_the_rigs_own_tests_take_no_fixture_of_the_bench_the_scenarios_share() -> None:
    """The rule that lets the ``hil-rig`` group run beside ``hil-scenarios``: a rig test builds its own bench
    (namespaces, a local rig); one that took the bench file's ``rig`` or ``site`` would drive the bench a
    scenario is measuring at that moment (on a lab bench: the one rig box)."""
    bench_fixtures = _fixtures_defined(ast.parse((REPO_ROOT / "hil_tests" / "conftest.py").read_text()))
    assert {"rig", "site", "cloud_endpoint", "host_links"} <= bench_fixtures  # the check reads the right file
    rig_group = [path for path in sorted((REPO_ROOT / "hil_tests").rglob("test_*.py"))
                 if suite.worker_group("hil", [], path.relative_to(REPO_ROOT).as_posix(), []) == "hil-rig"]
    assert len(rig_group) >= 5
    taken = {}
    for path in rig_group:
        tree = ast.parse(path.read_text())
        taken[path.name] = sorted((_fixtures_requested(tree) - _fixtures_defined(tree)) & bench_fixtures)
    assert not any(taken.values()), f"rig tests that take the bench's fixtures: {taken}"
