"""An independent computation of the pipeline's outputs in DuckDB SQL, straight from the landing files.

It shares no code with the Spark jobs: it reads every line as text, decides for itself what is a landing
record, a reading or a reject (docs/pipeline.md is its specification), and returns pandas frames in the
layout of the Spark outputs, so a test can compare the two table for table. Latency percentiles are left
out (Spark's are approximate by design); counts, minima, maxima and averages are compared exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: every `make test` worker collects this folder, few tests use DuckDB
    import duckdb
    import pandas as pd

NOT_A_RECORD = "landing line is not a JSON record (cut short?)"

_LINES = """
CREATE OR REPLACE TEMP VIEW lines AS
SELECT kind, line, filename, hour_start_ms FROM (
  SELECT '{kind}' AS kind, line, filename,
         epoch_ms(strptime(regexp_extract(filename, 'date=([0-9-]+)/hour=([0-9]+)', 1) || ' '
                           || regexp_extract(filename, 'date=([0-9-]+)/hour=([0-9]+)', 2), '%Y-%m-%d %H')) AS hour_start_ms
  FROM read_csv('{glob}', columns = {{'line': 'VARCHAR'}}, delim = '\\x01', quote = '', escape = '', header = false,
                filename = true, hive_partitioning = false, auto_detect = false)
)
"""


def connect(landing: Path | str) -> duckdb.DuckDBPyConnection:
    """A connection with ``lines`` (every landing line) and ``landed`` (the records) over ``landing``."""
    import duckdb

    con = duckdb.connect()
    parts = []
    for kind in ("events", "metrics", "quarantine", "firmware"):
        files = sorted(Path(landing, kind).glob("date=*/hour=*/*.jsonl"))
        if files:
            con.execute(_LINES.format(kind=kind, glob=f"{landing}/{kind}/date=*/hour=*/*.jsonl").replace(
                "CREATE OR REPLACE TEMP VIEW lines", f"CREATE TEMP TABLE lines_{kind}"))
            parts.append(f"SELECT * FROM lines_{kind}")
    empty = "SELECT NULL::VARCHAR kind, NULL::VARCHAR line, NULL::VARCHAR filename, NULL::BIGINT hour_start_ms WHERE false"
    con.execute("CREATE TEMP VIEW lines AS " + " UNION ALL ".join(parts or [empty]))
    con.execute("""
    CREATE TEMP VIEW checked AS
    SELECT *, CASE WHEN NOT coalesce(json_valid(line), false) OR try(json_type(line)) <> 'OBJECT' THEN 'not a record'
                   WHEN try(line ->> '$.received_ms') IS NULL THEN 'no received_ms' END AS line_error
    FROM lines WHERE trim(line) <> '';
    CREATE TEMP VIEW landed AS
    SELECT kind, filename, line ->> '$.message_id' AS message_id, line ->> '$.gateway_id' AS gateway_id,
           line ->> '$.device_id' AS device_id, line ->> '$.output' AS output,
           (line ->> '$.priority')::INTEGER AS priority, (line ->> '$.enqueued_ms')::BIGINT AS enqueued_ms,
           (line ->> '$.sent_ms')::BIGINT AS sent_ms, (line ->> '$.received_ms')::BIGINT AS received_ms,
           line ->> '$.topic' AS topic, line ->> '$.payload' AS payload,
           line ->> '$.payload_base64' AS payload_base64, line -> '$.properties' AS properties,
           line ->> '$.reason' AS reason
    FROM checked WHERE line_error IS NULL;
    CREATE TEMP VIEW events AS
    SELECT * FROM landed WHERE kind = 'events'
    QUALIFY row_number() OVER (PARTITION BY message_id ORDER BY received_ms, filename, sent_ms) = 1;
    CREATE TEMP VIEW delivered_messages AS  -- events and the thermostats' update status messages
    SELECT * FROM landed WHERE kind IN ('events', 'firmware')
    QUALIFY row_number() OVER (PARTITION BY message_id ORDER BY received_ms, filename, sent_ms) = 1;
    CREATE TEMP VIEW telemetry AS
    SELECT *,
      CASE WHEN payload IS NULL THEN 'payload is not UTF-8 text'
           WHEN NOT coalesce(json_valid(payload), false) OR try(json_type(payload)) <> 'OBJECT'
             THEN 'payload is not a JSON object'
           WHEN coalesce(json_type(pj, '$.temperature'), '') NOT IN ('DOUBLE', 'BIGINT', 'UBIGINT')
             THEN 'temperature is missing or not a number'
           WHEN NOT isfinite((pj ->> '$.temperature')::DOUBLE) THEN 'temperature is not a finite number'
           WHEN coalesce(json_type(pj, '$.set_point'), '') NOT IN ('DOUBLE', 'BIGINT', 'UBIGINT')
             THEN 'set_point is missing or not a number'
           WHEN NOT isfinite((pj ->> '$.set_point')::DOUBLE) THEN 'set_point is not a finite number'
           WHEN coalesce(json_type(pj, '$.heater'), '') <> 'BOOLEAN' THEN 'heater is missing or not a boolean'
           WHEN coalesce(json_type(pj, '$.ts_ms'), '') NOT IN ('BIGINT', 'UBIGINT') THEN 'ts_ms is missing or not an integer'
           WHEN coalesce(json_type(pj, '$.device'), '') <> 'VARCHAR' THEN 'device is missing or not a string'
           WHEN pj ->> '$.device' <> device_id
             THEN 'device ''' || (pj ->> '$.device') || ''' does not match gw-device-id ''' || device_id || ''''
      END AS telemetry_reason
    FROM (SELECT *, CASE WHEN coalesce(json_valid(payload), false) THEN payload END AS pj FROM landed)
    WHERE kind = 'events' AND output = 'data';
    CREATE TEMP VIEW readings AS
    SELECT gateway_id, device_id, message_id, received_ms,
           (pj ->> '$.temperature')::DOUBLE AS temperature, (pj ->> '$.set_point')::DOUBLE AS set_point,
           (pj ->> '$.heater')::BOOLEAN AS heater, (pj ->> '$.ts_ms')::BIGINT AS reading_ms
    FROM telemetry WHERE telemetry_reason IS NULL
    QUALIFY row_number() OVER (PARTITION BY message_id ORDER BY received_ms, filename, sent_ms) = 1;
    """)
    return con


def rollups(con: duckdb.DuckDBPyConnection, window_minutes: int = 5) -> pd.DataFrame:
    window_ms = window_minutes * 60_000
    return comparable(con.execute(f"""
    SELECT gateway_id, device_id, reading_ms - reading_ms % {window_ms} AS window_start_ms, count(*) AS readings,
           min(temperature) AS temperature_min, avg(temperature) AS temperature_avg,
           max(temperature) AS temperature_max, avg(set_point) AS set_point_avg,
           arg_max(set_point, (reading_ms, message_id)) AS set_point_last, avg(heater::INTEGER) AS heater_duty_cycle
    FROM readings GROUP BY ALL""").df())


def delivered(con: duckdb.DuckDBPyConnection, window_minutes: int = 5) -> pd.DataFrame:
    """Delivery latency without the percentiles: messages and the worst latency per window."""
    window_ms = window_minutes * 60_000
    return comparable(con.execute(f"""
    SELECT gateway_id, priority, received_ms - received_ms % {window_ms} AS window_start_ms,
           count(*) AS delivered, max(received_ms - enqueued_ms) AS latency_max_ms
    FROM delivered_messages GROUP BY ALL""").df())


def quarantine(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """(stage, reason, message_id, received_ms) of every quarantined message or line, one per message."""
    return comparable(con.execute(f"""
    SELECT 'telemetry' AS stage, telemetry_reason AS reason, message_id, received_ms FROM telemetry
    WHERE telemetry_reason IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY message_id ORDER BY received_ms, filename, sent_ms) = 1
    UNION ALL
    SELECT 'ingest', reason, message_id, received_ms FROM landed WHERE kind = 'quarantine'
    QUALIFY row_number() OVER (
        PARTITION BY coalesce(message_id, md5(concat_ws(chr(31), topic, coalesce(payload, ''),
                                                        coalesce(payload_base64, ''), properties::VARCHAR)))
        ORDER BY received_ms, filename, sent_ms) = 1
    UNION ALL
    SELECT 'landing', CASE line_error WHEN 'not a record' THEN '{NOT_A_RECORD}'
                                      ELSE 'landing record has no received_ms' END,
           try(line ->> '$.message_id'), coalesce(try((line ->> '$.received_ms')::BIGINT), hour_start_ms) FROM checked
    WHERE line_error IS NOT NULL""").df())


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in one order, missing values as None, whichever engine produced ``frame``."""
    frame = frame.sort_values(list(frame.columns)).reset_index(drop=True)
    return frame.astype(object).where(frame.notna(), None)
