"""`python -m trainer.inspect --model_dir=DIR --step=N [--show]`: the examples global batch
N read, per replica, for any past step of a run.

Exact because the data position is a function of the step (input_pipelines/order.py): the
examples used before step N are the newest checkpoint's at or before step N-1 (its meta
records them), plus each step since at the batch size of the config that trained it
(config_history/ records every config a run started with, and the step it started at);
global batch N is then positions [examples, examples + B), replica r of R reading
[examples + r*B/R, examples + (r+1)*B/R), each position the row `order.rows` gives of
the training split. A loss spike at step N is traced to its rows.
"""
