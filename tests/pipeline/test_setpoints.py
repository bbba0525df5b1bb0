"""The set-point change log step (pure pandas), fed all at once or in pieces."""




def rows(*readings):
    import pandas as pd

    return pd.DataFrame(
        [(ts, f"m{ts}", sp, 20.0) for ts, sp in readings],
        columns=["reading_ms", "message_id", "set_point", "temperature"],
    )


def test_logs_the_first_reading_and_every_change():
    from pipeline.jobs.setpoints import step

    out, last = step(("gw1", "t1"), None, rows((1, 20.0), (2, 20.0), (3, 21.0), (4, 21.0), (5, 20.0)))
    assert out[["changed_ms", "previous_set_point", "set_point"]].fillna(-1).values.tolist() == [
        [1, -1, 20.0], [3, 20.0, 21.0], [5, 21.0, 20.0]]
    assert set(out["gateway_id"]) == {"gw1"} and set(out["device_id"]) == {"t1"}
    assert last == {"set_point": 20.0}


def test_pieces_give_the_same_log_as_the_whole():
    import pandas as pd

    from pipeline.jobs.setpoints import step

    whole = rows((1, 20.0), (2, 21.0), (3, 21.0), (4, 22.0))
    at_once, _ = step(("g", "d"), None, whole)
    first, last = step(("g", "d"), None, whole.iloc[:2].reset_index(drop=True))
    second, _ = step(("g", "d"), last, whole.iloc[2:].reset_index(drop=True))
    pieces = pd.concat([first, second], ignore_index=True)
    pd.testing.assert_frame_equal(pieces, at_once.reset_index(drop=True), check_dtype=False)
