"""Batch sizes the data and this machine can hold: checked before anything is allocated.

Runs after the sources are built and before the writer lock (trainer/api.py):
a refused batch size is one line, exit 2, and model_dir is never touched. Two
checks, numpy and /proc only:

- a training batch larger than the training split is refused (it would hold
  examples twice); one equal to it is full-batch training, allowed. An eval
  batch larger than the eval split is fine (one partial batch).
- a batch's bytes in flight: one example's decoded bytes (the source says:
  `decoded_example_bytes`) x this process's share of the global batch x the
  batches a pipeline holds at least (the one a step consumes and the one
  prefetched behind it; tf.data's autotuned buffers come on top, within its own
  RAM budget). More than the memory available (MemAvailable, or the cgroup's
  limit less its usage when lower) cannot run: refused, naming both numbers.
  The model's activations are not counted: passing is necessary, not sufficient.

A tf.data stream (StreamSource) has no length or example size before it runs:
it is not checked here.
"""

from input_pipelines.errors import DataError
from input_pipelines.sources import IndexableSource, Source

BATCHES_IN_FLIGHT = 2  # at least: the batch a step consumes, and the one prefetched behind it


def check_batches(train: Source, evaluation: Source, *, train_batch: int | None,
                  eval_batch: int, processes: int = 1,
                  available: int | None = None) -> None:
  """DataError if a batch cannot be formed or held. `train_batch` None: no training (eval,
  export); `processes`: the workers that share each global batch."""
  if train_batch is not None and isinstance(train, IndexableSource) and train_batch > len(train):
    raise DataError(f"train.global_batch_size={train_batch} is larger than the training "
                    f"split ({len(train)} examples, {train.where}): a batch would hold "
                    f"examples twice; use at most {len(train)}")
  available = available_bytes() if available is None else available
  if available is None:
    return
  batches = [("eval.global_batch_size", eval_batch, evaluation)]
  if train_batch is not None:
    batches.insert(0, ("train.global_batch_size", train_batch, train))
  for field, batch, source in batches:
    if not isinstance(source, IndexableSource):
      continue
    examples = -(-min(batch, len(source)) // processes)
    needed = source.decoded_example_bytes() * examples * BATCHES_IN_FLIGHT
    if needed > available:
      raise DataError(f"{field}={batch} needs at least {_size(needed)} of memory for its "
                      f"batches in flight ({BATCHES_IN_FLIGHT} batches of {examples} examples "
                      f"of {_size(source.decoded_example_bytes())}), but this machine has "
                      f"{_size(available)} available; lower {field}")


def available_bytes() -> int | None:
  """Memory this process may still take: MemAvailable, or the cgroup's limit less its usage
  when that is lower; None if neither can be read."""
  candidates = []
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          candidates.append(int(line.split()[1]) * 1024)
  except (OSError, ValueError, IndexError):
    pass
  for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                  "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
    limit, usage = _read_int(limit_file), _read_int(usage_file)
    if limit is not None and usage is not None and limit < 1 << 60:  # v1 "no limit": ~2^63
      candidates.append(max(0, limit - usage))
      break
  return min(candidates) if candidates else None


def _read_int(path: str) -> int | None:
  try:
    with open(path, encoding="ascii") as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None  # cgroup v2 "max": no limit


def _size(num_bytes: int) -> str:
  for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if num_bytes >= scale:
      return f"{num_bytes / scale:.1f} {unit}"
  return f"{num_bytes} bytes"
