"""Each output's columns are written once (``schemas.OutputSchema``), and one module reaches into Spark's JVM.
No Spark session here: the schemas are module constants, checked without a JVM."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"
#: Output -> its schema's name in ``pipeline.jobs.schemas``, which imports pyspark: imported by the test, not
#: at collection (every test worker collects this folder).
OUTPUTS = {
    "rollups": "ROLLUPS_OUTPUT",
    "setpoint_changes": "SETPOINT_CHANGES_OUTPUT",
    "delivery_latency": "DELIVERY_LATENCY_OUTPUT",
    "queue_counters": "QUEUE_COUNTERS_OUTPUT",
    "quarantine": "QUARANTINE_OUTPUT",
}


@pytest.mark.parametrize("name", OUTPUTS)
def test_the_ddl_is_the_computed_schema(name):
    from pipeline.jobs import schemas
    from pipeline.jobs.schemas import struct_of

    schema = getattr(schemas, OUTPUTS[name])
    assert struct_of(schema.ddl.replace("bigint", "long")) == schema.computed
    assert len(set(schema.written)) == len(schema.written), "a column written twice"
    assert schema.written[-1] == "date"


def test_windowed_outputs_put_the_window_where_they_always_had_it():
    from pipeline.jobs import schemas

    assert schemas.ROLLUPS_OUTPUT.written[:4] == ("gateway_id", "device_id", "window_start", "window_end")
    assert schemas.DELIVERY_LATENCY_OUTPUT.written[-3:] == ("clock_offset_ms", "clock_suspect", "date")
    assert schemas.QUEUE_COUNTERS_OUTPUT.written[-3:] == ("window_start", "window_end", "date")
    assert "window_start_ms" not in schemas.QUEUE_COUNTERS_OUTPUT.written
    assert "window_end_ms" not in schemas.QUEUE_COUNTERS_OUTPUT.written


def test_a_select_that_misses_or_invents_a_column_is_refused_before_spark():
    from pipeline.jobs.schemas import windowed

    schema = windowed("key string, window_start_ms long, n long")
    with pytest.raises(ValueError, match=r"written columns not given: \['window_start', 'window_end', 'date'\]"):
        schema.select(None, {})  # type: ignore[arg-type] - refused before the frame is used
    with pytest.raises(ValueError, match=r"derived columns not written: \['extra'\]"):
        schema.select(None, {"window_start": 1, "window_end": 1, "date": 1, "extra": 1})  # type: ignore[arg-type]


def test_an_unknown_type_in_an_output_ddl_fails_at_import():
    from pipeline.jobs.schemas import OutputSchema

    with pytest.raises(KeyError):
        OutputSchema.of("a string, b decimal")


#: PySpark's private handles to the JVM (``pyspark/sql/*.py``, ``pyspark/context.py``), as attributes or
#: fetched by name.
PRIVATE_HANDLE = re.compile(r"^_(jvm|jsc|gateway|jdf|jrdd|jcol|jconf|jsparkSession|jwrite|jreader|jsq|jsqm|jmap|jseq)$")


def private_jvm_handles(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and PRIVATE_HANDLE.match(node.attr):
            found.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and PRIVATE_HANDLE.match(node.args[1].value)):
            found.add(node.args[1].value)
    return found


def test_only_the_files_module_uses_pysparks_private_jvm_handles():
    users = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
             if private_jvm_handles(ast.parse(path.read_text()))}
    assert users == {"jobs/files.py"}


@pytest.mark.parametrize("source", ["sc._jvm.java.lang.System", "sc._jsc.hadoopConfiguration()",
                                    "frame._jdf.queryExecution()", "spark._jsparkSession.conf()",
                                    "writer._jwrite.save(path)", "getattr(spark, '_jsparkSession')"])
def test_the_scan_finds_each_kind_of_private_handle(source):
    assert private_jvm_handles(ast.parse(source))


def test_the_scan_ignores_private_names_that_are_not_jvm_handles():
    assert not private_jvm_handles(ast.parse("self._join(a)\nself._json = 1\nspark.sparkContext.getConf()"))
