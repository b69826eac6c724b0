"""A table of numbers in a CSV file, read in chunks: memory bounded by a chunk, not the file.

The header row names the columns; every other row holds one finite number per
column (blank lines are skipped). numpy's C parser (`np.loadtxt`) reads each
chunk of lines; a chunk it refuses (a cell that is not a number, a quoted cell,
a row of another length, a non-finite value) is read again cell by cell with the
csv module, which accepts what float() reads (quoted numbers, spaces) and names
the file, line and column of anything else in one DataError. The values are
float64 parses rounded to float32: the same as parsing the whole file at once.
"""
import csv
import itertools
from typing import Callable, Iterator
import warnings

import numpy as np

from input_pipelines.errors import DataError

CHUNK_CHARS = 1 << 20  # characters of the file parsed at a time


def read_header(path: str) -> list[str]:
  """The column names, checked: present, non-empty, distinct."""
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      header = next(csv.reader(f), None)
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot read ({reason(e)})") from None
  if header is None:
    raise DataError(f"{path}: the file is empty (expected a header row naming the columns)")
  names = [n.strip() for n in header]
  if any(not n for n in names):
    raise DataError(f"{path}: the header has an empty column name (column "
                    f"{[not n for n in names].index(True) + 1})")
  duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
  if duplicate is not None:
    raise DataError(f"{path}: the header names column {duplicate!r} twice")
  return names


def chunks(path: str, names: list[str], *, chunk_chars: int | None = None,
           on_read: Callable[[int], None] | None = None) -> Iterator[np.ndarray]:
  """float32 [rows, len(names)] blocks of the rows after the header, in file order;
  `on_read(bytes read so far)` after each block (for a progress bar)."""
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      reader = csv.reader(f)
      next(reader)  # the header, checked by read_header
      line = reader.line_num  # physical lines read so far
      while True:
        lines = f.readlines(chunk_chars or CHUNK_CHARS)
        if not lines:
          return
        table = _parse_fast(lines, len(names))
        if table is None:  # find the bad cell, or read what the fast parser cannot
          table, consumed = _parse_slowly(path, names, itertools.chain(lines, f), line,
                                          len(lines))
          line += consumed
        else:
          line += len(lines)
        if on_read is not None:
          on_read(f.buffer.tell())
        if len(table):
          yield table.astype(np.float32)
  except (OSError, UnicodeDecodeError, csv.Error) as e:
    raise DataError(f"{path}: cannot read ({reason(e)})") from None


def _parse_fast(lines: list[str], num_columns: int) -> np.ndarray | None:
  """float64 [rows, columns], or None where numpy's parser refuses or a value is not finite."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # "input contained no data": blank lines only
      table = np.loadtxt(lines, delimiter=",", dtype=np.float64, ndmin=2, comments=None)
  except ValueError:
    return None
  if len(table) == 0:
    return None  # blank lines (or none): counted by the slow path
  if table.shape[1] != num_columns or not np.isfinite(table).all():
    return None
  return table


def _parse_slowly(path: str, names: list[str], lines: Iterator[str], line_before: int,
                  at_least: int) -> tuple[np.ndarray, int]:
  """(float64 [rows, columns], physical lines read): at least `at_least` lines, and the
  rest of a quoted cell that spans more; DataError naming the line and column."""
  reader = csv.reader(lines)
  rows = []
  for row in reader:
    line = line_before + reader.line_num
    if row and not (len(row) == 1 and not row[0].strip()):  # not a blank line
      if len(row) != len(names):
        raise DataError(f"{path}: line {line} has {len(row)} cells, the header {len(names)}")
      rows.append([_number(path, line, name, cell) for name, cell in zip(names, row)])
    if reader.line_num >= at_least:
      break
  return np.array(rows, dtype=np.float64).reshape(len(rows), len(names)), reader.line_num


def _number(path: str, line: int, name: str, cell: str) -> float:
  try:
    value = float(cell)
  except ValueError:
    what = "is empty" if not cell.strip() else f"holds {cell.strip()[:40]!r}, not a number"
    raise DataError(f"{path}: line {line}, column {name!r} {what}") from None
  if not np.isfinite(value):
    raise DataError(f"{path}: line {line}, column {name!r} holds {cell.strip()!r}, not "
                    f"a finite number")
  return value


def reason(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
