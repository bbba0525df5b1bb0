"""A real Spark standalone cluster on this machine: one master and N workers, started the way an operator
starts them on separate hosts (``bin/spark-class`` of the pip-installed pyspark with the
``deploy.master.Master`` / ``deploy.worker.Worker`` classes), and ``spark-submit`` against it.

Each daemon binds port 0 and says in its log which port it got (no port race with other tests on the
machine); readiness is the master's JSON UI listing every worker ``ALIVE``, never a sleep. Every daemon
runs in its own session (process group): ``stop()`` ends the groups, then checks that no process of the
cluster is left - executors the workers started and the Python workers the executors started, which
pyspark's daemon moves to a process group of its own.

``BatchOnCluster`` submits the batch job to such a cluster from a thread: the cluster test's JVMs (master,
workers, driver, executors) start and work while the local Spark tests run beside them, and the test only
reads the outcome (``tests/pipeline/conftest.py``: ``cluster_batch``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from testing.waiting import wait_until
from tests.pipeline.jvm import TEST_JAVA_OPTIONS

MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_UI_PORT = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
DAEMON_MEMORY = "256m"  # master and worker JVMs: bookkeeping only, the work happens in the executors


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def dependencies_only_python(folder: Path) -> Path:
    """A Python that has this venv's packages but not the project: what a cluster host has.

    The venv has the project installed in editable mode, so its own interpreter would import ``pipeline``
    from the checkout whatever ``--py-files`` ships; this one (a bare venv whose ``.pth`` line adds the
    venv's site-packages, whose own ``.pth`` files - the editable finder - are then not run) can import
    pyspark, pyarrow and pandas, and ``pipeline`` only from the zip.
    """
    import sysconfig
    import venv

    venv.create(folder, with_pip=False, symlinks=True)
    python = folder / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "cluster-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


class StandaloneCluster:
    def __init__(self, work_dir: Path, workers: int = 2, worker_cores: int = 1, worker_memory: str = "1g") -> None:
        self.work_dir = Path(work_dir)
        self.worker_count = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.home = spark_home()
        self.daemons: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.submitting: subprocess.Popen[str] | None = None
        self.master_url = ""
        self.ui_port = 0
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    # -- starting --------------------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        return dict(os.environ, SPARK_HOME=str(self.home), SPARK_LOCAL_IP="127.0.0.1",
                    SPARK_DAEMON_MEMORY=DAEMON_MEMORY, SPARK_DAEMON_JAVA_OPTS=TEST_JAVA_OPTIONS, **extra)

    def _spawn(self, name: str, args: Sequence[str], **env: str) -> subprocess.Popen[bytes]:
        log = self.work_dir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([str(self.home / "bin" / "spark-class"), *args], env=self.env(**env),
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.daemons.append((process, log))
        return process

    def start_master(self, timeout: float = 120) -> None:
        """The master, and its URL and UI port from its log."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        properties = self.work_dir / "master.properties"
        properties.write_text("spark.master.rest.enabled false\n")  # its fixed port 6066 would collide
        master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                        "--port", "0", "--webui-port", "0", "--properties-file", str(properties)])
        log = self.work_dir / "master.log"

        def bound() -> bool:
            text = log.read_text(errors="replace")
            url, ui = MASTER_URL.search(text), MASTER_UI_PORT.search(text)
            if master.poll() is not None:
                raise RuntimeError(f"the Spark master exited:\n{text}")
            if url and ui:
                self.master_url, self.ui_port = url.group(1), int(ui.group(1))
            return bool(url and ui)

        wait_until(bound, timeout, what=lambda: f"Spark master bound:\n{log.read_text(errors='replace')}")

    def start(self) -> None:
        """Master and workers without waiting for any of them: a thread starts the master, reads its URL
        from its log and starts the workers, while the caller does something else (their JVMs take
        seconds each to start). ``wait_ready`` waits for all of it and raises what went wrong."""
        def start_all() -> None:
            try:
                self.start_master()
                self.start_workers()
            except BaseException as error:  # re-raised by wait_ready, in the caller's thread
                self._start_error = error

        self._starting = threading.Thread(target=start_all, name="spark-cluster-start", daemon=True)
        self._starting.start()

    def _started(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        if self._start_error is not None:
            raise self._start_error

    def start_workers(self) -> None:
        for number in range(1, self.worker_count + 1):
            folder = self.work_dir / f"worker{number}"
            (folder / "local").mkdir(parents=True, exist_ok=True)
            self._spawn(f"worker{number}", ["org.apache.spark.deploy.worker.Worker", self.master_url,
                                            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                                            "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                                            "--work-dir", str(folder / "work")],
                        SPARK_LOCAL_DIRS=str(folder / "local"))

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
            return json.load(answer)

    def wait_ready(self, timeout: float = 180) -> dict:
        """Until the master's JSON UI shows every worker ALIVE; returns that state."""
        self._started()
        seen: dict = {}

        def all_alive() -> bool:
            for process, log in self.daemons:
                if process.poll() is not None:
                    raise RuntimeError(f"{log.stem} exited:\n{log.read_text(errors='replace')}")
            try:
                seen.update(self.state())
                seen.pop("not json", None)
            except json.JSONDecodeError as error:  # seen once: an HTML page from the UI just after it bound
                seen["not json"] = error.doc[:200]
                return False
            except urllib.error.HTTPError as error:  # seen once under load: 404 before the JSON handler is attached
                seen["not json"] = f"HTTP {error.code}"
                return False
            return sum(worker["state"] == "ALIVE" for worker in seen.get("workers", [])) == self.worker_count

        wait_until(all_alive, timeout, what=lambda: f"{self.worker_count} ALIVE workers, master says {seen}")
        return seen

    # -- submitting ------------------------------------------------------------------------------------
    def submit(self, args: Sequence[str], timeout: float = 480) -> subprocess.CompletedProcess[str]:
        """``spark-submit --master <this cluster> ARGS`` (client mode: the driver runs here), from the work
        folder: a checkout in the current folder would be importable by the driver."""
        command = [str(self.home / "bin" / "spark-submit"), "--master", self.master_url, *args]
        process = subprocess.Popen(command, cwd=self.work_dir, env=self.env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.submitting = process
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise AssertionError(f"spark-submit did not finish within {timeout}s:\n{output[-20000:]}") from None
        finally:  # a timeout, or the test interrupted: the driver (JVM and Python) goes too
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        return subprocess.CompletedProcess(command, process.returncode, output)

    # -- stopping --------------------------------------------------------------------------------------
    def stop(self, timeout: float = 30) -> list[str]:
        """Kill every daemon's process group; returns what was still alive after that (should be nothing,
        and is killed before returning)."""
        with contextlib.suppress(BaseException):  # a failed start still leaves processes to stop
            self._started()
        if self.submitting is not None and self.submitting.poll() is None:  # stopped while a job runs
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.submitting.pid, signal.SIGKILL)
        everything: list[psutil.Process] = []
        for process, _ in self.daemons:
            with contextlib.suppress(psutil.NoSuchProcess):
                everything += [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        for process, _ in self.daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process, _ in self.daemons:
            process.wait(timeout)
        _, alive = psutil.wait_procs(everything, timeout=timeout)
        left = [f"{proc.pid} {' '.join(proc.cmdline()[:3])}" for proc in alive if _is_running(proc)]
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.daemons.clear()
        return left


def _is_running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# Tiny data, as in conftest.py's session: no adaptive planning, interpreted expressions and the tests' Java
# options (jvm.py) start faster than they lose; small heaps, the machine is shared. Nothing here changes what the job computes.
SUBMIT_OPTIONS = [
    "--driver-memory", "512m", "--executor-memory", "512m",
    "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
    "--conf", "spark.log.level=WARN",
    "--conf", "spark.sql.adaptive.enabled=false",
    "--conf", "spark.sql.codegen.wholeStage=false", "--conf", "spark.sql.codegen.factoryMode=NO_CODEGEN",
    "--conf", f"spark.driver.extraJavaOptions={TEST_JAVA_OPTIONS}",
    "--conf", f"spark.executor.extraJavaOptions={TEST_JAVA_OPTIONS}",
]


@dataclass(frozen=True)
class BatchSubmission:
    """What ``BatchOnCluster`` did: the project-less Python's attempt to import the project, the master's
    state once every worker was alive and once the job was done, spark-submit's outcome, where the job
    wrote, and what of the cluster was still running after it was stopped (nothing, if all went well)."""

    import_attempt: subprocess.CompletedProcess[str]
    ready_state: dict
    done: subprocess.CompletedProcess[str]
    done_state: dict
    out: Path
    waited_s: float
    submit_s: float
    left_running: list[str]


class BatchOnCluster:
    """``python -m pipeline batch`` submitted to a master and two workers started for it, the project
    shipped as ``python -m pipeline package`` builds it (``--py-files pipeline.zip``), to an executor
    Python that has the ``[pipeline]`` packages and not the project (``dependencies_only_python``); the
    job compacts ``landing`` into a bronze table of its own, then writes every output.

    ``start`` returns at once; a thread builds the package and the Python while the cluster's JVMs start,
    submits, and stops the cluster once the job is done. ``result`` waits for it."""

    def __init__(self, work_dir: Path, landing: str, hil: str, lateness: str) -> None:
        self.work_dir = Path(work_dir)
        self.cluster = StandaloneCluster(self.work_dir / "cluster")
        self._job = ["--landing", landing, "--hil", hil, "--lateness", lateness]
        self._thread = threading.Thread(target=self._run, name="batch-on-cluster", daemon=True)
        self._submission: BatchSubmission | None = None
        self._error: BaseException | None = None
        self._stopping = threading.Event()

    def start(self) -> BatchOnCluster:
        self.cluster.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._submission = self._submit()
        except BaseException as error:  # re-raised by result(), in the test's thread
            self._error = error

    def _submit(self) -> BatchSubmission:
        from pipeline.package import build_package

        archive, launcher = build_package(self.work_dir / "dist")
        python = dependencies_only_python(self.work_dir / "worker-python")
        attempt = subprocess.run([python, "-c", "import pyarrow, pandas, pyspark; import pipeline"],
                                 cwd=self.work_dir, capture_output=True, text=True, timeout=120)
        out = self.work_dir / "cluster-out"
        waited = time.monotonic()
        state = self.cluster.wait_ready()
        if self._stopping.is_set():
            raise RuntimeError("stopped before the job was submitted")
        submitted = time.monotonic()
        done = self.cluster.submit([
            "--py-files", str(archive), "--conf", f"spark.pyspark.python={python}", *SUBMIT_OPTIONS,
            str(launcher), "batch", *self._job, "--bronze", str(self.work_dir / "cluster-bronze"),
            "--out", str(out), "--shuffle-partitions", "4",
        ])
        took = time.monotonic() - submitted
        done_state = self.cluster.state()
        left = self.cluster.stop()  # at once: its five JVMs are done; their logs stay for the test
        return BatchSubmission(attempt, state, done, done_state, out, submitted - waited, took, left)

    def result(self, timeout: float = 600) -> BatchSubmission:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the batch job on the cluster did not finish within {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._submission is not None
        return self._submission

    def stop(self) -> list[str]:
        """Stops the cluster (and a job still running); what of it was still running after that."""
        self._stopping.set()
        left = self.cluster.stop()
        self._thread.join(60)
        return left
