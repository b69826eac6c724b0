"""Reader for the IDX format of the MNIST distribution files (plain or .gz).

Every failure raises `DataError` naming the file, so a truncated download or a
wrong file is one clear line for the user, not a numpy traceback.
"""
import gzip
import os
import zlib

import numpy as np

from input_pipelines.errors import DataError

_UINT8 = 0x08


def read_idx(path: str) -> np.ndarray:
  """Returns the uint8 array stored in the IDX file at `path`."""
  try:
    if path.endswith(".gz"):
      with gzip.open(path, "rb") as f:
        raw = f.read()
    else:
      with open(path, "rb") as f:
        raw = f.read()
  except FileNotFoundError:
    raise DataError(f"{path}: file not found") from None
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f"{path}: cannot read (corrupt or truncated gzip: {e})") from None

  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
    raise DataError(f"{path}: not an IDX file (bad magic number)")
  dtype_code, ndim = raw[2], raw[3]
  if dtype_code != _UINT8:
    raise DataError(f"{path}: IDX element type 0x{dtype_code:02x} is not uint8")
  header_size = 4 + 4 * ndim
  if len(raw) < header_size:
    raise DataError(f"{path}: truncated IDX header")
  shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
  expected = header_size + int(np.prod(shape))
  if len(raw) != expected:
    raise DataError(
        f"{path}: truncated or padded IDX file: header says shape {shape} "
        f"({expected} bytes), the file has {len(raw)} bytes")
  return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(shape)


def find_idx_file(directory: str, stem: str) -> str:
  """`directory/stem` or `directory/stem.gz`, whichever exists."""
  for candidate in (stem, stem + ".gz"):
    path = os.path.join(directory, candidate)
    if os.path.isfile(path):
      return path
  raise DataError(f"{os.path.join(directory, stem)}[.gz]: file not found")
