"""Binary classification of table rows with the tabular MLP; synthetic rows by default.

Offline, a few seconds of training; reaches >= 0.95 eval binary accuracy:

  python -m trainer --config=tabular --model_dir=/tmp/distloop/tabular
  # your own table: a CSV with a header row, numeric cells and a 0/1 column `label`
  # (or a .npz, or a folder with train.csv and test.csv; see input_pipelines/datasets/table.py):
  python -m trainer --config=tabular --model_dir=/tmp/distloop/my_table \
      --config.data.dir=/path/to/table.csv --config.data.label_column=label
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.model.name = "tabular"          # Dense(hidden_units, relu) -> Dense(1): one logit
  config.model.hidden_units = 16
  config.model.num_outputs = 1
  config.data.name = "tabular"           # synthetic rows from the seed unless data.dir is set
  config.data.dir = ""
  config.data.num_features = 10          # synthetic: features per row
  config.data.num_train_examples = 10_000
  config.data.num_eval_examples = 2_000
  config.train.loss = "binary_crossentropy"  # on the logit
  config.train.steps = 500               # 3.2 epochs of the synthetic rows
  config.train.global_batch_size = 64
  config.train.steps_per_loop = 100
  config.train.optimizer = "adam"
  config.train.learning_rate = 1e-2      # a model this small wants a larger rate than the CNN
  config.eval.interval = 250
  config.eval.metrics = "binary_accuracy"
  config.checkpoint.interval = 250
  config.checkpoint.best_metric = "binary_accuracy"
  config.checkpoint.best_mode = "max"
  config.lock()
  return config
