"""The built-in supervised Task: one model, one loss, metrics, one optimizer, written on
the public Task contract (trainer/task/) as a user's Task is.

`task.py` the Task (build, train_step with gradient accumulation, eval_step, export);
`losses.py` and `metrics.py` (`train.loss`, `eval.metrics`: built-in names or
MODULE:FUNCTION, per example); `probabilities.py` (`train.from_logits`); and
`compatibility.py` (the model, the loss, the metrics and the data checked together on
real examples at start-up). A multi-output model's per-output syntax is parsed before
TensorFlow loads: trainer/setup/heads.py.
"""
