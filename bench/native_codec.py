"""What compiling the codec with mypyc would save per QoS 1 message, measured, without installing it.

    .venv/bin/python bench/native_codec.py              # 3 rounds of bench/broker_core.py, each tree in turn
    .venv/bin/python bench/native_codec.py --durable --rounds 5

Issue 30, goal 4: if the per-message floor of the pure-Python broker is not enough, which part of the hot
path would have to leave Python, and what would it buy? The codec (``appliance/broker/codec``: framing,
PUBLISH and PUBACK parsing, the writer) is the part that is plain functions over bytes, so mypyc compiles
it from the same source. This copies ``appliance`` and ``bench`` into a temporary folder, compiles
``reader``, ``writer``, ``properties`` and ``reasons`` there with mypyc (``packets`` cannot be: mypyc
takes its class attribute ``type`` for a dataclass field), and runs ``bench/broker_core.py`` in this tree
and in the compiled copy in turn: the broker CPU per message of each, cheapest 100-turn block.

Needs a C compiler and the Python headers (gcc and python3-dev on Debian) and mypy (the ``test``
extra). Nothing is installed: the gateway and every test keep using the pure-Python codec.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ("reader", "writer", "properties", "reasons")
MIN_BLOCK = re.compile(r"min block ([0-9.]+) us")


def compile_copy(target: Path) -> None:
    """``appliance`` and ``bench`` copied to ``target``, the codec modules compiled in place there."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(ROOT / "appliance", target / "appliance", ignore=ignore)
    shutil.copytree(ROOT / "bench", target / "bench", ignore=ignore)
    modules = [f"appliance/broker/codec/{name}.py" for name in COMPILED]
    mypyc = Path(sys.executable).with_name("mypyc")
    subprocess.run([str(mypyc), *modules], cwd=target, check=True, capture_output=True)
    check = "import appliance.broker.codec.reader as r; print(r.__file__)"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=target, check=True, capture_output=True, text=True)
    if not loaded.stdout.strip().endswith(".so"):
        raise SystemExit(f"the compiled reader is not the one imported: {loaded.stdout.strip()}")


def cpu_per_message(tree: Path, extra: list[str]) -> float:
    output = subprocess.run([sys.executable, str(tree / "bench" / "broker_core.py"), *extra], cwd=tree,
                            check=True, capture_output=True, text=True).stdout
    found = MIN_BLOCK.search(output)
    if found is None:
        raise SystemExit(f"no figure in bench/broker_core.py's output: {output}")
    return float(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=1500)
    parser.add_argument("--durable", action="store_true", help="QoS 1 to a durable subscriber (broker.db)")
    args = parser.parse_args(argv)
    if shutil.which("gcc") is None:
        parser.error("needs gcc and the Python headers (apt-get install gcc python3-dev)")
    extra = ["--turns", str(args.turns), *(["--durable"] if args.durable else [])]
    with tempfile.TemporaryDirectory(prefix="bench-native-") as tmp:
        compiled = Path(tmp)
        compile_copy(compiled)
        pure: list[float] = []
        native: list[float] = []
        for round_number in range(args.rounds):
            pure.append(cpu_per_message(ROOT, extra))
            native.append(cpu_per_message(compiled, extra))
            print(f"round {round_number + 1}: pure {pure[-1]:.2f} us, compiled codec {native[-1]:.2f} us per message; "
                  f"load average {psutil.getloadavg()[0]:.1f}", flush=True)
    best_pure, best_native = min(pure), min(native)
    print(f"{'durable' if args.durable else 'qos1'}: broker CPU per message, cheapest block of {args.rounds} runs: "
          f"pure {best_pure:.2f} us, compiled codec {best_native:.2f} us ({100 * (1 - best_native / best_pure):.0f} % less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
