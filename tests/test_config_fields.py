"""A misspelt field of a config from `configs.get`, in Python: the command line's one line
(`unknown config field --config.train.stepz (did you mean 'steps'?)`, tests/
test_cli_bad_input.py) without the flag's dashes, not ml_collections' list of every field
of the section (issue 43); and the config is still an ml_collections config everywhere
else (configs/fields.py)."""
import copy
import pickle

import ml_collections
import pytest

import configs
from trainer.errors import UserError


@pytest.mark.parametrize("misspelt, line", [
    (lambda c: setattr(c.train, "stepz", 5), "train.stepz (did you mean 'steps'?)"),
    (lambda c: c.train.__setitem__("stepz", 5), "train.stepz (did you mean 'steps'?)"),
    (lambda c: c.train.stepz, "train.stepz (did you mean 'steps'?)"),  # read
    (lambda c: setattr(c.trian, "steps", 5), "trian (did you mean 'train'?)"),
    (lambda c: setattr(c.model, "xyzzy", 5), "model.xyzzy (configs/common.py lists every field)"),
])
def test_a_misspelt_field_is_one_line_naming_it_and_the_closest(misspelt, line):
  """Caught: `config.train.stepz = 5` raised AttributeError listing the 27 fields of
  `train` and their values, the suggestion on a second line."""
  config = configs.get("synthetic")
  with pytest.raises(UserError) as raised:
    misspelt(config)
  assert str(raised.value) == f"unknown config field {line}"
  assert isinstance(raised.value, AttributeError) and isinstance(raised.value, KeyError)


def test_the_config_stays_an_ml_collections_config():
  """hasattr, get, equality with a plain ConfigDict, copies and pickles: as before, and the
  copies still say a misspelt field in one line; an added section too."""
  config = configs.get("synthetic")
  config.train.steps = 7
  assert not hasattr(config.train, "stepz") and config.train.get("stepz", 1) == 1
  plain = ml_collections.ConfigDict(config.to_dict())
  plain.lock()
  assert config == plain and plain == config and config.train == plain.train
  with config.unlocked():
    config.gan = {"latent_dim": 3}
  for copied in (copy.deepcopy(config), pickle.loads(pickle.dumps(config)),
                 config.copy_and_resolve_references()):
    assert copied == config and copied.train.steps == 7 and copied.is_locked
    with pytest.raises(UserError, match=r"^unknown config field gan.latent_dimm \(did you mean"):
      copied.gan.latent_dimm = 4
