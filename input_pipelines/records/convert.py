"""`python -m input_pipelines.convert --from=FORMAT --input=PATH --output=DIR [...]`

Converts a dataset into sharded array_record files plus manifest.json, the
random-access format `data.name='records'` reads. Formats and their flags:
input_pipelines/records/convert_inputs.py. `--verify=DIR` re-hashes a converted folder.

What it guarantees:
- Bad input is one line `distloop: error: ...` on stderr and exit 2, found
  before the output folder is created (a CSV is read through once first, with a
  progress bar, to check every cell); a bad file found midway -- an image that
  does not decode, a TFRecord that does not fit --features -- also exits 2, and
  removes what this run wrote (the output folder, if this run created it).
- Every shard is verified when written (its record count, and the SHA-256 of its
  records read back) before it is renamed into place and recorded in
  DIR/progress.json; manifest.json is written last, with each shard's size,
  record count and SHA-256, so a folder with a manifest is complete.
- Interrupted (SIGTERM/SIGINT: exit 42; or killed), the same command again skips
  the shards already done and finishes; a finished folder is a quick no-op.
  Another input into the same folder is refused (exit 2).
"""
import contextlib
import os
import shutil
import signal
import sys
import time

from absl import app
from absl import flags

from input_pipelines import native_output
from input_pipelines.errors import DataError
from input_pipelines.records import convert_inputs
from input_pipelines.records import manifest as manifest_lib
from input_pipelines.records import progress as progress_lib
from input_pipelines.records import shards

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 42
_SIZE_SAMPLE = 64  # records whose mean size sets the records per shard

_FROM = flags.DEFINE_enum("from", None, list(convert_inputs.FORMATS), "input format")
_INPUT = flags.DEFINE_string("input", None, "the input: a folder, a file, or TFRecord globs")
_OUTPUT = flags.DEFINE_string("output", None, "the folder to write (data.dir of 'records')")
_EVAL_INPUT = flags.DEFINE_string("eval_input", "", "tfrecord: the eval split's files (globs)")
_FEATURES = flags.DEFINE_string("features", "", "tfrecord: the feature spec, JSON or @file.json")
_LABEL = flags.DEFINE_string("label", "label", "csv: the label column; tfrecord: the label key")
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", 0.2, "csv, image_folder without a test "
                                    "split: the held-out share")
_SEED = flags.DEFINE_integer("seed", 0, "csv, image_folder: the seed of the held-out share")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 32, "image_folder: images are read at this size")
_CHANNELS = flags.DEFINE_integer("channels", 3, "image_folder: 3 (RGB) or 1 (grayscale)")
_SHARD_MB = flags.DEFINE_integer("shard_mb", 256, "about this many MB per shard file",
                                 lower_bound=1)
_COMPRESS = flags.DEFINE_bool("compress", True, "zstd per record (off for incompressible data)")
_VERIFY = flags.DEFINE_string("verify", None, "re-hash every shard of this converted folder "
                              "against its manifest, instead of converting")


class Interrupted(Exception):
  pass


def main(argv):
  if len(argv) > 1:
    _fail(EXIT_BAD_INPUT, f"unexpected arguments: {' '.join(argv[1:])}")
  native_output.quiet_tensorflow()
  try:
    if _VERIFY.value:
      return _verify(_VERIFY.value)
    for flag in ("from", "input", "output"):
      if not flags.FLAGS[flag].value:
        raise DataError(f"--{flag} is required (or --verify=DIR)")
    options = convert_inputs.Options(
        eval_input=_EVAL_INPUT.value, features=_FEATURES.value, label=_LABEL.value,
        eval_fraction=_EVAL_FRACTION.value, seed=_SEED.value, image_size=_IMAGE_SIZE.value,
        channels=_CHANNELS.value)
    # Checks the input first (TensorFlow is not needed for that, except to read TFRecords),
    # then loads TensorFlow, which encodes the records, with its start-up lines hidden (and
    # the input's progress bar, if the check loads TensorFlow itself).
    build = convert_inputs.FORMATS[_FROM.value]
    try:
      with _signals_interrupt(), (native_output.native_startup_silenced() if _FROM.value in
                                  convert_inputs.LOADS_TENSORFLOW else contextlib.nullcontext()):
        source = build(_INPUT.value, options)
    except Interrupted:
      raise Interrupted(f"interrupted while reading {_INPUT.value}, before anything was "
                        f"written") from None
    with native_output.native_startup_silenced():
      import tensorflow  # noqa: F401  its start-up lines silenced here  pylint: disable=g-import-not-at-top,unused-import,import-outside-toplevel
    return convert(source, _OUTPUT.value, shard_bytes=_SHARD_MB.value << 20,
                   compress=_COMPRESS.value)
  except DataError as e:
    _fail(EXIT_BAD_INPUT, e)
  except Interrupted as e:
    print(f"distloop: {e}", file=sys.stderr)
    return EXIT_INTERRUPTED
  except OSError as e:  # a disk that is full, a shard that did not read back as written
    _fail(EXIT_FAILURE, e)


def convert(source: convert_inputs.Input, output: str, *, shard_bytes: int = 256 << 20,
            compress: bool = True, show_progress: bool = True) -> int:
  """Writes (or finishes writing) `source` into `output`; also a library entry point."""
  if os.path.isfile(manifest_lib.path_of(output)):
    existing = manifest_lib.read(output)
    if existing.fingerprint != source.fingerprint:
      raise DataError(f"{output}: already holds converted data of another input; choose "
                      f"another --output")
    print(f"Already converted: {output} (python -m input_pipelines.convert --verify={output} "
          f"re-hashes it)")
    return EXIT_OK
  progress = progress_lib.Progress.resume_or_start(output, source.fingerprint)
  created, fresh = progress.created, not progress.done
  plans = {split: _plan(progress, split, source.splits[split], shard_bytes)
           for split in manifest_lib.SPLITS}
  total = sum(s.num_examples for s in source.splits.values())
  done = sum(progress.records_done(names) for names, _ in plans.values())
  started, converted = time.perf_counter(), 0
  bar = progress_lib.bar(total, done, enabled=show_progress)
  try:
    with _signals_interrupt():
      for split in manifest_lib.SPLITS:
        converted += _write_split(progress, source.splits[split], *plans[split],
                                  compress=compress, bar=bar)
  except DataError:
    progress_lib.clear(bar)  # the error's one line stands alone
    if created:  # bad input found midway: leave nothing behind
      shutil.rmtree(output, ignore_errors=True)
    elif fresh:  # a folder that was empty: empty again
      _remove_written(progress)
    raise
  except Interrupted:
    bar.close()
    shards_done = len(progress.done)
    raise Interrupted(f"interrupted with {shards_done} of "
                      f"{sum(len(n) for n, _ in plans.values())} shards written to {output}; "
                      f"run the same command again to finish") from None
  bar.close()
  manifest = manifest_lib.Manifest(
      source.features, source.label,
      {split: [progress.done[name] for name in plans[split][0]]
       for split in manifest_lib.SPLITS},
      source.metadata, source.fingerprint)
  for split in manifest_lib.SPLITS:  # what was written is what the input holds
    if manifest.num_records(split) != source.splits[split].num_examples:
      raise OSError(f"{output}: split {split} has {manifest.num_records(split)} records, "
                    f"the input {source.splits[split].num_examples}")
  manifest_lib.write(output, manifest)
  progress.remove()
  seconds = time.perf_counter() - started
  print(f"Converted {manifest.num_records('train')} train and {manifest.num_records('eval')} "
        f"eval records into {sum(len(n) for n, _ in plans.values())} shards in {output} "
        f"({converted} written now, {converted / max(seconds, 1e-9):.0f} records/s); every "
        f"shard read back and checked; manifest.json lists their SHA-256")
  return EXIT_OK


def _plan(progress, split: str, data: convert_inputs.Split, shard_bytes: int):
  """(shard names, records per shard) of a split: fixed on the first run, then recorded."""
  per_shard = progress.records_per_shard.get(split)
  if per_shard is None:
    sample = []
    for record in data.records(0):
      sample.append(len(record))
      if len(sample) == _SIZE_SAMPLE:
        break
    per_shard = max(1, int(shard_bytes // max(1.0, sum(sample) / len(sample))))
    progress.records_per_shard[split] = per_shard
  count = -(-data.num_examples // per_shard)
  return [shards.name(split, i, count) for i in range(count)], per_shard


def _remove_written(progress) -> None:
  for shard in progress.done.values():
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(progress.directory, shard["file"]))
  progress.remove()


def _write_split(progress, data: convert_inputs.Split, names: list[str], per_shard: int, *,
                 compress: bool, bar) -> int:
  """Writes the shards of `names` not done yet, in order; the records written."""
  todo = [i for i, name in enumerate(names) if name not in progress.done]
  if not todo:
    return 0
  if todo != list(range(todo[0], len(names))):
    raise DataError(f"{progress.directory}: progress.json records shards out of order; "
                    f"delete the folder and convert again")
  progress.make_directory()
  records = data.records(todo[0] * per_shard)
  written = 0
  for index in todo:
    count = min(per_shard, data.num_examples - index * per_shard)
    writer = shards.Writer(os.path.join(progress.directory, names[index]), compress)
    try:
      for _ in range(count):
        writer.write(next(records))
        bar.update(1)
      progress.finish(names[index], writer.close())
    except BaseException:
      writer.discard()
      raise
    written += count
  return written


@contextlib.contextmanager
def _signals_interrupt():
  """SIGTERM/SIGINT -> Interrupted at the next record (the shard in progress is dropped)."""
  def handler(signum, frame):
    del signum, frame
    raise Interrupted("interrupted")
  previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for signum, handler_before in previous.items():
      signal.signal(signum, handler_before)


def _verify(directory: str) -> int:
  manifest = manifest_lib.read(directory)
  manifest_lib.check_shards(directory, manifest)
  problems = manifest_lib.verify(directory, manifest)
  if problems:
    raise DataError(f"{problems[0]}" + (f" (and {len(problems) - 1} more)"
                                        if len(problems) > 1 else ""))
  count = sum(len(manifest.splits[s]) for s in manifest_lib.SPLITS)
  print(f"{directory}: {count} shards, {manifest.num_records('train')} train and "
        f"{manifest.num_records('eval')} eval records; every SHA-256 matches the manifest")
  return EXIT_OK


def _fail(code: int, error) -> None:
  print(f"distloop: error: {' '.join(str(error).split())}", file=sys.stderr)
  sys.exit(code)


def _parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(EXIT_BAD_INPUT, e)


def run() -> None:
  app.run(main, flags_parser=_parse_flags)
