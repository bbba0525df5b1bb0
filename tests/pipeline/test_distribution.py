"""The pipeline is its own distribution (``appliance-pipeline``, pipeline/pyproject.toml) with its own
entry point; the gateway's wheel and ``make run`` carry none of it, ``make venv`` installs both."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.package import package_files

ROOT = Path(__file__).resolve().parents[2]


def wheel(source: Path, out: Path) -> zipfile.ZipFile:
    """``source`` built into a wheel in ``out``, from a copy (pip builds in the tree, leaving ``build/``)."""
    copy = out.parent / f"{out.name}-source"
    # symlinks=True: the image's root tree holds absolute links (systemd's .wants/) that dangle on the host
    shutil.copytree(source, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", ".venv", ".git",
                                                                 "var", "artifacts", "dist"))
    source = copy
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(out), str(source)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("*.whl")
    return zipfile.ZipFile(built)


@pytest.mark.slow  # a wheel build: tens of seconds on the loaded machine (the fast check is the next test)
@pytest.mark.timeout(300)
def test_the_gateway_wheel_carries_no_pipeline(tmp_path):
    names = wheel(ROOT, tmp_path / "gateway").namelist()
    assert {name for name in names if name.startswith("appliance/")} == gateway_package_files()
    assert not [name for name in names if name.startswith("pipeline/")]
    metadata = next(name for name in names if name.endswith("METADATA"))
    requires = wheel_text(tmp_path / "gateway", metadata)
    assert "pyspark" not in requires and "pyarrow" not in requires and "matplotlib" not in requires


@pytest.mark.slow  # a wheel build
@pytest.mark.timeout(300)
def test_the_pipeline_wheel_is_the_pipeline_with_its_own_command(tmp_path):
    built = wheel(ROOT / "pipeline", tmp_path / "pipeline")
    names = built.namelist()
    modules = {name for name in names if name.endswith(".py")}
    assert modules == {path.as_posix() for path in package_files()}
    assert not [name for name in names if name.startswith("appliance/")]
    entry_points = built.read(next(name for name in names if name.endswith("entry_points.txt"))).decode()
    assert "appliance-pipeline = pipeline.cli:main" in entry_points
    metadata = built.read(next(name for name in names if name.endswith("METADATA"))).decode()
    assert "Name: appliance-pipeline" in metadata and "Requires-Dist: pyspark" in metadata


def gateway_package_files() -> set[str]:
    """Every file of the ``appliance`` package in the tree: what an installed gateway has to find (its
    modules, and ``config/default.toml``, which ``appliance run`` without ``--config`` reads)."""
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / "appliance").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def test_every_file_of_the_gateway_package_that_is_not_a_module_is_package_data():
    """The fast half of the wheel check: a wheel carries only modules unless ``package-data`` names the
    file (the embedded default configuration was missing from every wheel, and ``appliance run`` with no
    ``--config`` failed on an installed gateway)."""
    import fnmatch
    import tomllib

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-data", {})
    not_modules = sorted(name for name in gateway_package_files() if not name.endswith(".py"))
    assert not_modules, "the embedded default configuration at least"
    unlisted = [
        name for name in not_modules
        if not any(fnmatch.fnmatch(name, f"{package.replace('.', '/')}/{pattern}")
                   for package, patterns in package_data.items() for pattern in patterns)
    ]
    assert unlisted == []


def test_the_gateway_distribution_finds_only_the_gateway_packages():
    import tomllib

    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert root["tool"]["setuptools"]["packages"]["find"]["include"] == ["appliance*"]
    assert "pipeline" not in root["project"].get("optional-dependencies", {})
    own = tomllib.loads((ROOT / "pipeline" / "pyproject.toml").read_text())
    assert own["project"]["name"] == "appliance-pipeline"
    assert own["project"]["scripts"] == {"appliance-pipeline": "pipeline.cli:main"}


def wheel_text(folder: Path, member: str) -> str:
    (built,) = folder.glob("*.whl")
    return zipfile.ZipFile(built).read(member).decode()


def test_make_run_installs_the_gateway_alone_and_make_venv_both():
    run = subprocess.run(["make", "-n", "-B", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "pip install --quiet -e .\n" in run and "pipeline" not in run
    venv = subprocess.run(["make", "-n", "-B", "venv"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-e ./pipeline" in venv


def test_python_dash_m_pipeline_still_works_from_the_repository_root():
    done = subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "ingest" in done.stdout
