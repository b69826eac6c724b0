"""The config's one table (trainer/setup/validation.py FIELDS): every field of
configs/common.py has its start-up check and names the code that acts on it, and that
code reads it. A field added without a check, or code moved without its entry, fails
here."""
import os

import pytest

from configs import common
from tests.support.cli import REPO
from trainer.setup import validation


def _fields(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _fields(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}"


def test_every_field_is_in_the_table_once():
  fields = list(_fields(common.base_config()))
  assert sorted(fields) == sorted(validation.FIELDS)


@pytest.mark.parametrize("field", sorted(validation.FIELDS))
def test_the_code_the_table_names_reads_the_field(field):
  _, reader = validation.FIELDS[field]
  path = os.path.join(REPO, reader)
  assert os.path.isfile(path), f"{field}: {reader} does not exist"
  with open(path) as f:
    assert field.split(".")[-1] in f.read(), f"{field}: {reader} does not read it"


def test_the_default_config_passes_every_check():
  validation.check_config(common.base_config())
