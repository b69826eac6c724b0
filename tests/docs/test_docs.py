"""The docs name only what exists: every link resolves (file and heading), every config
field written as `section.field` is a field of distloop's config, and every `--flag` of
`python -m trainer` (and of `trainer.launch`, `input_pipelines.convert`) is a flag the
command defines. Static: reads text and source, trains nothing, imports no TensorFlow."""
import pathlib
import re

import pytest

from configs import common

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SECTIONS = tuple(common.base_config().keys())  # model, data, train, eval, checkpoint, runtime

# Backticked `section.field` spans that are not config fields: Keras attributes and file
# names that happen to start with a section's name, and a function of a module.
NOT_CONFIG_FIELDS = {
    "model.fit", "model.predict", "model.losses", "model.output_names",  # a Keras model's
    "train.csv", "train.npz",                           # a table's training file
    "runtime.configure",  # trainer/cluster/runtime.py's function (docs/performance.md)
    "runtime.py",         # trainer/cluster/runtime.py's name (docs/layout.md)
    "predict.py",         # trainer/loop/predict.py's name (docs/layout.md)
}
# Flags written as `--x` in prose that belong to other tools the docs show beside distloop.
OTHER_TOOLS_FLAGS = {
    "logdir",                           # tensorboard --logdir
    "ntasks", "signal", "requeue",      # Slurm's srun / sbatch
    "backend",                          # mlflow server --backend-store-uri
    "dist",                             # pytest-xdist's --dist loadgroup
}
# absl's own flags, accepted by every absl command (absl.logging and absl.app).
ABSL_FLAGS = {"verbosity", "v", "logtostderr", "alsologtostderr", "log_dir", "help",
              "helpfull", "helpshort", "flagfile", "undefok"}


def _text(page):
  return page.read_text()


def _without_fences(text):
  """The prose of a page: fenced code blocks blanked (they hold no links or headings)."""
  return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _fenced(text):
  """Each fenced block's lines, with shell continuations (`\\` + newline) joined."""
  blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
  return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def _spans(text):
  return re.findall(r"`([^`\n]+)`", _without_fences(text))


def github_anchors(text):
  """The anchors GitHub gives a page's headings: lower-case, punctuation dropped, spaces
  to '-', a repeated heading suffixed -1, -2, ..."""
  anchors, seen = set(), {}
  for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _without_fences(text), flags=re.M):
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else f"{slug}-{count}")
  return anchors


def test_github_anchors_follow_its_slug_rules():
  text = "# Objects (gs://, s3://)\n## `eval` and `continuous_eval`\n## A\n## A\n```\n# no\n```"
  assert github_anchors(text) == {"objects-gs-s3", "eval-and-continuous_eval", "a", "a-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_to_a_file_and_heading_that_exist(page):
  broken = []
  for target in re.findall(r"\]\(([^)\s]+)\)", _without_fences(_text(page))):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.exists():
      broken.append(f"{target}: no such file")
    elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(_text(resolved)):
      broken.append(f"{target}: no heading with that anchor in {resolved.relative_to(REPO)}")
  assert not broken, broken


def _documented_fields(text):
  """`section.field` at the start of a backticked span, and --config.section.field anywhere."""
  fields = {m.group(1) for span in _spans(text)
            for m in [re.match(rf"((?:{'|'.join(SECTIONS)})\.\w+)", span)] if m}
  fields |= set(re.findall(rf"--config\.((?:{'|'.join(SECTIONS)})\.\w+)", text))
  return fields - NOT_CONFIG_FIELDS


def test_every_documented_config_field_exists():
  """Fields of distloop's sections only: a plug-in's own fields live in sections of its
  config (`early_stop.patience`) or in its own config file, not in the defaults."""
  config = common.base_config()
  missing = [f"{page.relative_to(REPO)}: {field}" for page in PAGES
             for field in sorted(_documented_fields(_text(page)))
             if field.split(".")[1] not in config[field.split(".")[0]]]
  assert not missing, f"fields the docs name that configs/common.py lacks: {missing}"
  assert len(set().union(*(_documented_fields(_text(p)) for p in PAGES))) > 60  # it looked


def _defined_flags(*modules):
  """The absl flags a module defines (DEFINE_*("name", ...)), read from its source."""
  names = set()
  for module in modules:
    source = (REPO / module).read_text()
    names |= set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
  return names


def _argparse_flags(module):
  """The flags an argparse command defines (add_argument("--name", ...)), from its source."""
  return set(re.findall(r"add_argument\(\s*\"--(\w+)\"", (REPO / module).read_text()))


TRAINER_FLAGS = _defined_flags("trainer/cli/main.py") | ABSL_FLAGS
# python -m trainer.verify passes the job's --config and --config.FIELD flags on.
VERIFY_FLAGS = _argparse_flags("trainer/verify/__main__.py") | {"config", "help"}
INSPECT_FLAGS = _argparse_flags("trainer/inspect/__main__.py") | {"help"}
LAUNCH_FLAGS = _defined_flags("trainer/cluster/launch.py") | ABSL_FLAGS
CONVERT_FLAGS = _defined_flags("input_pipelines/records/convert.py") | ABSL_FLAGS


def _flag_names(args):
  """`--name` / `--name=value` / `--noname` (an absl bool) tokens; --config.FIELD is a field."""
  return re.findall(r"(?:^|\s)--(\w+)(?=[=\s]|$)", args)


def _unknown(names, known):
  return [n for n in names if n not in known and not (n.startswith("no") and n[2:] in known)]


def _commands(text):
  """(command, arguments) of every `python -m trainer|trainer.launch|input_pipelines.convert`
  and every `trainer.launch --x`, in code blocks and inline spans, cut at a pipe, a `&&`,
  a `;` or a comment."""
  found = []
  for line in _fenced(text) + _spans(text):
    for m in re.finditer(r"(?:python -m )?\b(trainer\.launch|trainer\.verify|trainer\.inspect"
                         r"|input_pipelines\.convert)\b|python -m (trainer)\b(?!\.)", line):
      rest = re.split(r"\s(?:\||&&|;|#)", line[m.end():])[0]
      found.append((m.group(1) or m.group(2), rest))
  return found


def test_the_command_lines_use_only_flags_their_commands_define():
  unknown = []
  for page in PAGES:
    for command, args in _commands(_text(page)):
      if command == "trainer.launch":
        own, _, trainer_args = args.partition(" -- ")
        # --preempted_exit_code: the launcher reads the trainers' (trainer/cluster/launch.py)
        bad = _unknown(_flag_names(own), LAUNCH_FLAGS | {"preempted_exit_code"})
        bad += _unknown(_flag_names(trainer_args), TRAINER_FLAGS)
      elif command == "trainer":
        bad = _unknown(_flag_names(args), TRAINER_FLAGS)
      elif command == "trainer.verify":
        bad = _unknown(_flag_names(args), VERIFY_FLAGS)
      elif command == "trainer.inspect":
        bad = _unknown(_flag_names(args), INSPECT_FLAGS)
      else:
        bad = _unknown(_flag_names(args), CONVERT_FLAGS)
      unknown += [f"{page.relative_to(REPO)}: {command} --{name}" for name in bad]
  assert not unknown, unknown


def test_every_flag_named_in_prose_exists():
  """`--x` in an inline span: a flag of one of distloop's commands (the benchmarks' too),
  or of a tool the docs show beside it."""
  known = (TRAINER_FLAGS | LAUNCH_FLAGS | CONVERT_FLAGS | VERIFY_FLAGS | INSPECT_FLAGS
           | _defined_flags("trainer/ray_train.py")
           | _defined_flags(*(p.relative_to(REPO) for p in (REPO / "benchmarks").glob("*.py")))
           | OTHER_TOOLS_FLAGS)
  unknown = [f"{page.relative_to(REPO)}: `{span}`" for page in PAGES for span in _spans(_text(page))
             if span.startswith("--") and _unknown(_flag_names(span), known)]
  assert not unknown, unknown
