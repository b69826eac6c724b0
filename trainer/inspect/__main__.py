"""`python -m trainer.inspect --model_dir=DIR --step=N [--show] [--json]`: the rows of the
training split that global batch N read, per replica (trainer/inspect/batches.py).
Exit 0, or 2 with one line where they cannot be known."""
import argparse
import sys


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m trainer.inspect", description=__doc__)
  parser.add_argument("--model_dir", required=True, help="a model_dir distloop trained")
  parser.add_argument("--step", type=int, required=True, help="the step (1 = the first)")
  parser.add_argument("--show", action="store_true",
                      help="also print each row's features and labels")
  parser.add_argument("--json", action="store_true", help="print the rows as one JSON line")
  args = parser.parse_args(argv)
  _load_tensorflow_quietly()
  from trainer.inspect import batches as inspect_batches  # pylint: disable=import-outside-toplevel
  from trainer.errors import UserError  # pylint: disable=import-outside-toplevel
  from input_pipelines.errors import DataError  # pylint: disable=import-outside-toplevel
  try:
    found = inspect_batches.batch(args.model_dir, args.step)
    if args.json:
      print(inspect_batches.as_json(found))
      return 0
    print(f"step {found.step}: global batch of {found.global_batch_size} from data position "
          f"{found.examples_before}, {found.replicas} replica(s)")
    for replica, rows in enumerate(found.rows):
      print(f"  replica {replica}: rows {rows}")
      if args.show:
        features, labels = inspect_batches.examples(found, rows)
        for i, row in enumerate(rows):
          print(f"    row {row}: features {_shown(features, i)} | labels {_shown(labels, i)}")
  except (UserError, DataError) as e:
    print(f"inspect: {e}", file=sys.stderr)
    return 2
  return 0


def _load_tensorflow_quietly() -> None:
  """TensorFlow's start-up lines (oneDNN, CUDA probing) hidden, as the trainer hides them."""
  from input_pipelines.native_output import native_startup_silenced  # pylint: disable=import-outside-toplevel
  with native_startup_silenced():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.config.list_physical_devices()


def _shown(tree, i) -> str:
  """Example `i` of a (nested) batch on one line: each array's shape, dtype and values."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  if isinstance(tree, dict):
    return "{" + ", ".join(f"{key}: {_shown(value, i)}" for key, value in tree.items()) + "}"
  if isinstance(tree, (list, tuple)):
    return "(" + ", ".join(_shown(value, i) for value in tree) + ")"
  value = np.asarray(tree[i])
  if value.ndim == 0:
    return str(value)
  values = np.array2string(value.reshape(-1), threshold=8, edgeitems=4, precision=4,
                           max_line_width=10**6)
  return f"{value.dtype}{list(value.shape)} {values}"


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
