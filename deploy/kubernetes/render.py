"""Fills the ${PLACEHOLDERS} of a manifest here and prints it (for `kubectl apply -f -`).

    python deploy/kubernetes/render.py deploy/kubernetes/job.yaml NAME=run1 \
        IMAGE=registry.example/distloop:1 CLAIM=shared-runs [NUM_WORKERS=4] \
        [CONFIG=mnist_cnn] [PREEMPTED_EXIT_CODE=143]
    python deploy/kubernetes/render.py deploy/kubernetes/job-bucket.yaml NAME=run1 \
        IMAGE=registry.example/distloop:1 MODEL_DIR=gs://my-bucket/runs

A template, not a chart: the manifests stay plain YAML to read and edit (more trainer
flags go in the container's args). A bad value is one line on stderr, exit 2.
"""
import os
import re
import string
import sys

DEFAULTS = {"NUM_WORKERS": "2", "CONFIG": "mnist_cnn", "PREEMPTED_EXIT_CODE": "42",
            "SERVICE_ACCOUNT": "default"}
# Each manifest needs the placeholders it has without a default: NAME and IMAGE, and
# CLAIM (job.yaml, jobset.yaml: a shared volume) or MODEL_DIR (job-bucket.yaml: a bucket).
_BUCKET = re.compile(r"(gs|s3)://[^/]+(/.*)?")
# Host names <NAME>-<index> (a JobSet's <NAME>-workers-0-<index>) must stay a DNS label.
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")


class RenderError(ValueError):
  """A missing or bad value: one line."""


def render(path: str, **values: str) -> str:
  """The manifest at `path` with DEFAULTS, then `values`, substituted."""
  values = {**DEFAULTS, **{key: str(value) for key, value in values.items()}}
  with open(path) as f:
    template = string.Template(f.read())
  missing = [key for key in template.get_identifiers() if not values.get(key)]
  if missing:
    raise RenderError(f"missing {', '.join(f'{key}=...' for key in missing)}")
  if not _NAME.fullmatch(values["NAME"]):
    raise RenderError(f"NAME={values['NAME']}: lower-case letters, digits and '-', "
                      f"at most 40 characters, starting with a letter")
  if not values["NUM_WORKERS"].isdigit() or int(values["NUM_WORKERS"]) < 1:
    raise RenderError(f"NUM_WORKERS={values['NUM_WORKERS']}: a positive integer")
  code = values["PREEMPTED_EXIT_CODE"]
  if not code.isdigit() or not 3 <= int(code) <= 255:
    raise RenderError(f"PREEMPTED_EXIT_CODE={code}: 3..255 (0, 1 and 2 mean done, failure "
                      f"and bad input)")
  if "MODEL_DIR" in template.get_identifiers() and not _BUCKET.fullmatch(values["MODEL_DIR"]):
    raise RenderError(f"MODEL_DIR={values['MODEL_DIR']}: a bucket folder, gs://BUCKET/PATH or "
                      f"s3://BUCKET/PATH (a volume: job.yaml with CLAIM=...)")
  try:
    return template.substitute(values)
  except KeyError as e:
    raise RenderError(f"{os.path.basename(path)} needs {e.args[0]}=...") from None


def main(argv: list[str]) -> int:
  if len(argv) < 2 or not all("=" in arg for arg in argv[2:]):
    print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
    return 2
  try:
    print(render(argv[1], **dict(arg.split("=", 1) for arg in argv[2:])), end="")
  except (RenderError, OSError) as e:
    print(f"render: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
