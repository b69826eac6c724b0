"""Regression of table rows with the tabular MLP; synthetic rows by default.

Offline, a few seconds of training; the synthetic targets have variance 1 (so
predicting their mean scores an MSE of about 1) and the model gets below 0.05:

  python -m trainer --config=regression --model_dir=/tmp/distloop/regression
  # your own table: a CSV with a header row, numeric cells and the target in `label`
  # (or a .npz, or a folder with train.csv and test.csv; see input_pipelines/datasets/table.py):
  python -m trainer --config=regression --model_dir=/tmp/distloop/my_regression \
      --config.data.dir=/path/to/table.csv --config.data.label_column=price
"""
import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.base_config()
  config.model.name = "tabular"          # Dense(hidden_units, relu) -> Dense(1): the prediction
  config.model.hidden_units = 16
  config.model.num_outputs = 1
  config.data.name = "regression"        # synthetic rows from the seed unless data.dir is set
  config.data.dir = ""
  config.data.num_features = 10          # synthetic: features per row
  config.data.num_train_examples = 10_000
  config.data.num_eval_examples = 2_000
  config.train.loss = "mean_squared_error"
  config.train.steps = 1000              # 6.4 epochs of the synthetic rows
  config.train.global_batch_size = 64
  config.train.steps_per_loop = 100
  config.train.optimizer = "adam"
  config.train.learning_rate = 1e-2
  config.eval.interval = 500
  config.eval.metrics = "mean_absolute_error,mean_squared_error"
  config.checkpoint.interval = 500
  config.checkpoint.best_metric = "mean_squared_error"
  config.checkpoint.best_mode = "min"    # lower is better
  config.lock()
  return config
