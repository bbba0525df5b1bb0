"""What a cluster needs of this project: the ``pipeline`` package as one zip for ``--py-files``, and the
script ``spark-submit`` starts.

The jobs import nothing of ``appliance`` and nothing MQTT (``pipeline/records.py`` holds what they share
with the ingest; ``tests/pipeline/test_imports.py`` keeps it so), so the zip holds ``pipeline`` alone; the
executors' Python needs only the Spark-side packages of ``appliance-pipeline`` (pyspark, pyarrow, pandas).
The ingest modules travel in the zip too but are never imported on the cluster: the ingest runs where the
project is installed.

The launcher is a file of its own rather than ``pipeline/__main__.py`` so that the hosts need nothing of
the repository, and because Python puts a script's folder first on ``sys.path``: with
``pipeline/__main__.py`` as the script, the package's modules would be importable under a second, top-level
name.

The zip is reproducible: entries sorted, fixed timestamps, no ``__pycache__``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
ZIP_NAME = "pipeline.zip"
LAUNCHER_NAME = "run_pipeline.py"
LAUNCHER = '''"""spark-submit [options] --py-files pipeline.zip run_pipeline.py compact|batch|stream ... (docs/pipeline.md)."""

import sys

from pipeline.cli import main

sys.exit(main())
'''
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def package_files(root: Path = PACKAGE_ROOT) -> list[Path]:
    """The package's modules, relative to its parent folder (``pipeline/...``): the ``.py`` files of the
    folders that are packages (an ``__init__.py``), so not a ``build/`` that building the distribution
    (``pipeline/pyproject.toml``) leaves in this folder."""
    def in_package(path: Path) -> bool:
        return all((folder / "__init__.py").is_file() for folder in path.parents if folder.is_relative_to(root))

    return sorted(path.relative_to(root.parent) for path in root.rglob("*.py") if in_package(path))


def build_package(out_dir: Path | str) -> tuple[Path, Path]:
    """Write ``pipeline.zip`` and ``run_pipeline.py`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / ZIP_NAME
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for relative in package_files():
            entry = zipfile.ZipInfo(relative.as_posix(), date_time=_EPOCH)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            bundle.writestr(entry, (PACKAGE_ROOT.parent / relative).read_bytes())
    launcher = out / LAUNCHER_NAME
    launcher.write_text(LAUNCHER)
    return archive, launcher
