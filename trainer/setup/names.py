"""The one list of the task's built-in names: the optimizers, learning-rate schedules,
losses and metrics a config may name.

Pure Python, so that the start-up checks (validation.py) read it before TensorFlow
loads; the registries that build them (optimizers.py, losses.py, metrics.py) answer
exactly these names (tests/docs/test_layout.py holds them to it).
"""

# optimizers.create: Keras's optimizers by their lowercase names, and "momentum" (SGD with
# train.momentum)
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adamax", "nadam", "rmsprop", "adagrad",
              "adadelta", "adafactor", "ftrl", "lamb", "lion")
LR_SCHEDULES = ("constant", "cosine", "step")  # optimizers.learning_rate
LOSSES = ("sparse_categorical_crossentropy", "binary_crossentropy", "mean_squared_error",
          "mean_absolute_error")  # losses.BUILTINS
METRICS = ("accuracy", "top_k_accuracy", "binary_accuracy", "mean_absolute_error",
           "mean_squared_error")  # metrics.resolve
