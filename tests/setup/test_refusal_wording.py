"""A refusal speaks the caller's language: the CLI's names its flags (`--model_dir=...`,
`--config.checkpoint.allow_other_trajectory=true`), the Python API's its arguments and the
config's fields (`model_dir=...`, `config.checkpoint.allow_other_trajectory=True`). Each
message is written once, in the CLI's words; trainer.errors.in_api_words is the one place
they become the API's."""
import json

import pytest

import configs
import trainer
from tests.support.cli import run_trainer
from trainer.errors import UserError, in_api_words
from trainer.state import elastic


@pytest.mark.parametrize("cli, api", [
    ("--model_dir=/runs/a: hdfs:// is not supported", "model_dir=/runs/a: hdfs:// is not supported"),
    ("use another --model_dir", "use another model_dir"),
    ("--checkpoint_step applies to --mode=eval and --mode=predict only, not --mode=train",
     "checkpoint_step applies to mode='eval' and mode='predict' only, not mode='train'"),
    ("pass --config.checkpoint.allow_other_trajectory=true to go on",
     "pass config.checkpoint.allow_other_trajectory=True to go on"),
    ("set --config.data.dir=/data, or --config=mnist_cnn",
     "set config.data.dir=/data, or config=mnist_cnn"),
    ("--preempted_exit_code=3", "--preempted_exit_code=3"),  # no argument of the API's
])
def test_in_api_words(cli, api):
  assert in_api_words(cli) == api


def _refused_resume(model_dir) -> None:
  """checkpoints/10 of a run on 2 replicas whose BatchNorm depends on the count, as its
  meta records it: a resume on 1 replica is refused from the JSON, at once."""
  meta = model_dir / "checkpoints" / "10" / "meta"
  meta.mkdir(parents=True)
  (meta / "metadata").write_text(json.dumps({
      "step": 10, "shape": elastic.shape(replicas=2, workers=1, strategy="mirrored"),
      "dependence": elastic.dependence(deterministic=True, replicas=["BatchNormalization 'bn'"],
                                       strategy=[])}))


@pytest.mark.skipif(
    elastic._shape_before_start(configs.get("synthetic").runtime) is None,  # pylint: disable=protected-access
    reason="a GPU's device files: the refusal comes after the restore")
def test_the_api_names_its_fields_and_the_cli_its_flags(tmp_path):
  """Catches the API's refusal naming a CLI flag (`--config.checkpoint...=true` raised from
  trainer.run) and the CLI's losing its flags."""
  _refused_resume(tmp_path)
  config = configs.get("synthetic")
  config.runtime.strategy, config.runtime.deterministic = "mirrored", True
  with pytest.raises(UserError) as raised:
    trainer.run(config, str(tmp_path))
  api = str(raised.value)
  assert "pass config.checkpoint.allow_other_trajectory=True to go on" in api, api
  assert "--" not in api, api
  cli = run_trainer(tmp_path, "--config=synthetic", "--config.runtime.strategy=mirrored",
                    "--config.runtime.deterministic=true", timeout=120)
  assert cli.returncode == 2, cli.stderr[-3000:]
  assert cli.error_lines() == [
      "distloop: error: " + api.replace("config.checkpoint.allow_other_trajectory=True",
                                        "--config.checkpoint.allow_other_trajectory=true")]
