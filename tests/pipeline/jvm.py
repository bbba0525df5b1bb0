"""The Java options of every JVM the pipeline tests start: the shared session's (``conftest.py``), and the
standalone cluster's master, workers, driver and executors (``spark_cluster.py``).

Rules:

* The data is tiny, so a JVM's start-up and the planning of each query are most of what it costs; nothing
  here may change what a job computes.
* C1 only (``-XX:TieredStopAtLevel=1``) and the serial collector: the optimising compiler and a parallel
  collector cost more CPU than they save in runs this short, on a machine whose cores the rest of the
  suite keeps busy.
* No verification of the bytecode loaded from jars (``-XX:-BytecodeVerificationRemote``, a diagnostic
  option, hence the unlock before it): a Spark JVM loads some 14,500 classes from pyspark's own jars,
  installed by pip, and verifying them is a sixth of a session's start-up CPU (docs/pipeline.md "Tests
  and benchmark"). Verification guards against malformed bytecode, which these jars do not have; it
  changes no result.
"""

TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
