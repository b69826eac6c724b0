"""A plain Keras script doing what `python -m trainer --config=synthetic
--config.train.steps=1` does up to its first step: import TensorFlow and Keras, build
the seed CNN (models/mnist_cnn.py, written out), hold MNIST-shaped uint8 data in
memory, compile with Adam and the loss and accuracy, and train one step with `fit`.
Prints `FIRST_STEP <unix time>` when that step is done (benchmarks/startup.py compares
it with distloop's), then exits. Not a distloop user: it imports nothing of distloop.
"""
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, size=(10_000, 28, 28, 1), dtype=np.uint8)
  labels = rng.integers(0, 10, size=10_000)
  model = keras.Sequential([
      keras.Input(shape=(28, 28, 1)),
      keras.layers.Conv2D(32, 3, activation="relu"),
      keras.layers.MaxPooling2D(2),
      keras.layers.Flatten(),
      keras.layers.Dense(64, activation="relu"),
      keras.layers.Dense(10),
  ])
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
  model.fit(images.astype("float32") / 255.0, labels, batch_size=64, epochs=1,
            steps_per_epoch=1, verbose=0)
  print(f"FIRST_STEP {time.time()}", flush=True)


if __name__ == "__main__":
  main()
