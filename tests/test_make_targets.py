"""Every test of the suite runs in exactly one Makefile target, and the Spark tests in none of ``make test``.

The targets' selections are read from the Makefile (each pytest command's ``-m`` expression and paths), the
targets CI runs from ``.ci/run``, the tests and their markers from a real collection of the whole suite:
the run's own where it collected the whole suite (``make test``'s workers do: the check costs nothing), else
one in this process. Not a unit module: collecting the suite starts processes (the hil modules probe for
network namespaces, matplotlib asks fontconfig).
"""

from __future__ import annotations

import ast
import shlex
from pathlib import Path
from typing import NamedTuple

import pytest
from _pytest.mark.expression import Expression  # the grammar of `-m`: the parser the Makefile's runs use

import conftest as suite

REPO_ROOT = Path(suite.__file__).parent

pytest_plugins = ("pytester",)


MAKEFILE = REPO_ROOT / "Makefile"
#: The Makefile targets that own tests: every test of the suite runs in exactly one of them.
OWNING_TARGETS = ("test", "test-spark", "test-cluster", "test-image", "test-slow", "test-image-slow")
#: The owners CI does not run (the long campaigns and stress repetitions; the arm64 image's emulated boots).
OUTSIDE_CI = {"test-slow", "test-image-slow"}


class Selection(NamedTuple):
    """What one Makefile target's pytest command selects: a ``-m`` expression over the paths it names."""

    markers: str
    paths: tuple[str, ...]  # none: pyproject's testpaths, the whole suite

    def selects(self, test: suite.CollectedTest) -> bool:
        in_paths = not self.paths or any(test.module == path or test.module.startswith(path.rstrip("/") + "/")
                                         for path in self.paths)
        return in_paths and Expression.compile(self.markers).evaluate(lambda name, **_: name in test.markers)


def recipe(makefile: str, target: str) -> str:
    """The commands of ``target``'s rule, continuation lines joined."""
    lines = makefile.replace("\\\n", " ").splitlines()
    start = next(number for number, line in enumerate(lines) if line.startswith(f"{target}:"))
    commands = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        commands.append(line.strip())
    return "\n".join(commands)


def selection(makefile: str, target: str) -> Selection:
    """The ``-m`` expression and paths of the one pytest command of ``target``."""
    (command,) = [line for line in recipe(makefile, target).splitlines() if "$(BIN)/pytest " in line]
    arguments = shlex.split(command.split("$(BIN)/pytest ", 1)[1].split(";")[0])
    markers, paths = "", []
    taking_a_value = {"-n", "--dist", "-p", "-m"}
    while arguments:
        argument = arguments.pop(0)
        if argument in taking_a_value:
            value = arguments.pop(0)
            markers = value if argument == "-m" else markers
        elif not argument.startswith(("-", "$(")):
            paths.append(argument)
    assert markers, f"make {target} selects no marker expression: {command}"
    return Selection(markers, tuple(paths))


def whole_suite(request: pytest.FixtureRequest, pytester: pytest.Pytester) -> list[suite.CollectedTest]:
    """Every test of the suite with its markers: this run's own collection when it collected the whole suite
    (``make test``: free), else a collection of it in this process."""
    collected = request.config.stash.get(suite.COLLECTED, None)
    if collected is not None:
        return collected
    found: list[suite.CollectedTest] = []

    class Keep:
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            # pytest imports a conftest afresh for each run: that run's module has its own stash key.
            root_conftest = session.config.pluginmanager.get_plugin(str(REPO_ROOT / "conftest.py"))
            found.extend(session.config.stash[root_conftest.COLLECTED])

    testpaths = [str(REPO_ROOT / path) for path in request.config.getini("testpaths")]
    pytester.inline_run("--collect-only", "-qq", f"--rootdir={REPO_ROOT}", "-c", str(REPO_ROOT / "pyproject.toml"),
                        "-p", "no:cacheprovider", *testpaths, plugins=[Keep()])
    assert found, "the collection of the whole suite found nothing"
    return found


def test_every_test_of_the_suite_runs_in_exactly_one_make_target(request: pytest.FixtureRequest,
                                                                 pytester: pytest.Pytester) -> None:
    """A test no target selects runs nowhere; one that two select runs twice. The selections are read from
    the Makefile, the targets CI runs from .ci/run, the tests' markers from a real collection."""
    makefile = MAKEFILE.read_text()
    selections = {target: selection(makefile, target) for target in OWNING_TARGETS}
    assert selection(makefile, "test-busy") == selections["test"]  # the same suite, beside a CPU hog
    ci = {line.split()[1] for line in (REPO_ROOT / ".ci/run").read_text().splitlines() if line.startswith("make ")}
    assert ci == set(OWNING_TARGETS) - OUTSIDE_CI
    tests = whole_suite(request, pytester)
    assert len(tests) > 3000
    owners = {test.nodeid: [target for target, chosen in selections.items() if chosen.selects(test)] for test in tests}
    wrong = {nodeid: targets for nodeid, targets in owners.items() if len(targets) != 1}
    assert not wrong, f"tests that do not run in exactly one target: {wrong}"
    unmarked = [test.nodeid for test in tests if test.takes_spark and "spark" not in test.markers]
    assert not unmarked, f"tests that take spark but are not marked spark: {unmarked}"
    assert {target for test in tests if test.takes_spark for target in owners[test.nodeid]} == {
        "test-spark", "test-cluster", "test-slow"}  # never make test: the Spark tests are a layer of their own


def test_no_test_or_fixture_asks_for_spark_where_collection_cannot_see_it() -> None:
    """The ``spark`` marker follows the fixtures a test declares, through other fixtures; a
    ``request.getfixturevalue("spark")`` is only known when it runs, so it would start a JVM in ``make test``."""
    dynamic = []
    for path in sorted([*(REPO_ROOT / "tests").rglob("*.py"), *(REPO_ROOT / "hil_tests").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getfixturevalue"
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "spark"):
                dynamic.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not dynamic
