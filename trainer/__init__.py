"""distloop's trainer: a readable custom training loop on tf.distribute.

Run it with `python -m trainer --config=NAME --model_dir=DIR`; the flow is read
top to bottom in `trainer/loop.py`.
"""
