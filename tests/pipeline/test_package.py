"""``python -m pipeline package``: the zip ``--py-files`` ships and the launcher ``spark-submit`` runs.
(That they work on a cluster is ``test_cluster.py``'s part.)"""

import zipfile
from pathlib import Path

from pipeline.cli import main
from pipeline.package import LAUNCHER_NAME, ZIP_NAME, build_package

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"


def test_the_zip_holds_every_module_of_the_package_and_nothing_else(tmp_path):
    archive, _ = build_package(tmp_path)
    names = zipfile.ZipFile(archive).namelist()
    expected = {f"pipeline/{path.relative_to(PACKAGE).as_posix()}" for path in PACKAGE.rglob("*.py")
                if "__pycache__" not in path.parts}
    assert set(names) == expected and len(names) == len(expected)
    assert {"pipeline/cli.py", "pipeline/jobs/batch.py", "pipeline/records.py"} <= expected
    assert not [name for name in names if not name.startswith("pipeline/")]  # nothing of appliance


def test_a_rebuild_is_byte_identical(tmp_path):
    first, _ = build_package(tmp_path / "a")
    second, _ = build_package(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()


def test_the_command_writes_both_files_and_says_how_to_submit(tmp_path, capsys):
    assert main(["package", "--out", str(tmp_path / "dist")]) == 0
    assert sorted(path.name for path in (tmp_path / "dist").iterdir()) == sorted([ZIP_NAME, LAUNCHER_NAME])
    launcher = (tmp_path / "dist" / LAUNCHER_NAME).read_text()
    assert "from pipeline.cli import main" in launcher
    compile(launcher, LAUNCHER_NAME, "exec")
    assert f"--py-files {tmp_path / 'dist' / ZIP_NAME}" in capsys.readouterr().out
