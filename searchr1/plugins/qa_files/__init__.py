"""The ``qa_files`` plugin: the QA file formats ``[data] train`` / ``[data] eval`` files come
in, registered by suffix through ``register_data_formats`` like any third-party format.

- ``.jsonl`` and ``.json``: JSONL or a JSON array of rows (either suffix reads both);
- ``.parquet``: the Search-R1 / verl parquet files.

Every row may be in any layout of :mod:`searchr1.plugins.qa_files.rows` (Search-R1 flat or
nested, or plain ``{"question", "answers"}``); :mod:`searchr1.plugins.qa_files.readers` holds
the readers. The core (:func:`searchr1.core.data.load_questions`) keeps the loading loop.
"""

from __future__ import annotations

from collections.abc import Callable

from searchr1.core.hookspecs import hookimpl
from searchr1.core.types import DataFormat
from searchr1.plugins.qa_files.readers import read_json_rows, read_parquet_rows


@hookimpl
def register_data_formats(register: Callable[[str, DataFormat], None]) -> None:
    json_rows = DataFormat(read_json_rows)
    register(".jsonl", json_rows)
    register(".json", json_rows)
    register(".parquet", DataFormat(read_parquet_rows))
