"""The broker's durable state: one SQLite database, ``broker.db``, written before anything is acknowledged.

``store`` (``BrokerStore``) buffers a loop turn's changes and commits them; ``schema`` is the layout and
its migrations; ``records`` the frozen rows handed over; ``reads`` and ``writes`` the statements;
``storage`` maps live objects to records and back; ``store_failure`` is what clients are answered when a
commit fails (full disk, I/O error, read-only file).
"""
