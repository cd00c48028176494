"""trainables/atomic.py read side: a Parquet file replaced by another process while it is read.

Run: .venv/bin/python -m pytest tests/trainables/test_atomic.py
"""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layerswap.trainables.atomic import atomic_write, read_parquet

ROOT = Path(__file__).resolve().parents[2]

# Another process rewrites the table (1-50 rows, wider as it grows) as fast as it can, the way the
# search's driver rewrites trials.parquet after each trial.
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import pyarrow as pa, pyarrow.parquet as pq
    from layerswap.trainables.atomic import atomic_write
    path, n = Path(sys.argv[1]), 1
    while True:
        t = pa.table({"a": list(range(n)), "s": ["x" * n] * n})
        atomic_write(path, lambda tmp: pq.write_table(t, tmp))
        n = n % 50 + 1
    """
)


def test_read_parquet_never_sees_a_torn_file_while_another_process_replaces_it(tmp_path):
    path = tmp_path / "t.parquet"
    atomic_write(path, lambda tmp: pq.write_table(pa.table({"a": [0], "s": ["x"]}), tmp))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT)
    by_handle, by_path, path_errors, handle_errors = 0, 0, 0, []
    try:
        deadline = time.time() + 10
        # Path reads interleaved as the control: they must fail sometimes, or the race is not here.
        while time.time() < deadline and (by_handle < 300 or path_errors < 5):
            try:
                rows = read_parquet(path).to_pylist()
                assert rows and all(r["s"] == "x" * len(rows) for r in rows)
            except Exception as e:
                handle_errors.append(repr(e))
            by_handle += 1
            try:
                pq.read_table(path)
            except Exception:
                path_errors += 1
            by_path += 1
            assert writer.poll() is None, "the writer process died"
    finally:
        writer.kill()
        writer.wait()
    assert not handle_errors, f"{len(handle_errors)}/{by_handle} reads failed: {handle_errors[:3]}"
    if path_errors == 0:
        pytest.fail(f"control: 0 of {by_path} path reads failed; the race was not exercised")


def test_read_parquet_errors_name_nothing_new(tmp_path):
    """Callers name the file; the helper lets the usual errors through for them to catch."""
    with pytest.raises(FileNotFoundError):
        read_parquet(tmp_path / "absent.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(pa.ArrowInvalid):
        read_parquet(bad)
