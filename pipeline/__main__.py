"""``python -m pipeline`` (and ``spark-submit pipeline/__main__.py``, with the package on ``--py-files``)."""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
