"""Token sequences of length 5..200 as data plug-ins (test_variable_length.py), and a small
masked model for them.

The task is learnable by a masked mean of embeddings: each sequence draws its tokens
mostly (70%) from one half of the vocabulary, and the label says which half. Padding
is token 0 (`data.pad_value=0`), which Embedding(mask_zero=True) masks; padding with
another value would be averaged in as a real token.
"""
import keras
import numpy as np

VOCAB = 50  # tokens 1..VOCAB-1; 0 is padding
MIN_LENGTH, MAX_LENGTH = 5, 200


def _sequences(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
  """An object array of n int32 sequences [L_i] and their int64 labels."""
  labels = rng.integers(0, 2, size=n)
  half = (VOCAB - 1) // 2
  examples = np.empty(n, dtype=object)
  for i, label in enumerate(labels):
    length = rng.integers(MIN_LENGTH, MAX_LENGTH + 1)
    own = rng.random(length) < 0.7
    low = rng.integers(1, half + 1, size=length)
    high = rng.integers(half + 1, VOCAB, size=length)
    examples[i] = np.where(own == (label == 0), low, high).astype(np.int32)
  return examples, labels.astype(np.int64)


def _splits(data_config):
  rng = np.random.default_rng(2024)
  return (_sequences(data_config.num_train_examples, rng),
          _sequences(data_config.num_eval_examples, rng))


def numpy_sequences(data_config, seed):
  """Both splits as (object array of sequences, labels)."""
  del seed
  return _splits(data_config)


def list_sequences(data_config, seed):
  """The features as a plain list of per-example arrays, in a dict."""
  del seed
  (x, y), (ex, ey) = _splits(data_config)
  return ({"tokens": list(x)}, y), ({"tokens": list(ex)}, ey)


def _stream(x, y):
  def make_dataset():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    def examples():
      yield from zip(x, y)
    return tf.data.Dataset.from_generator(examples, output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))
  return make_dataset


def stream_sequences(data_config, seed):
  """Both splits as unbatched tf.data streams of the same sequences."""
  del seed
  (x, y), (ex, ey) = _splits(data_config)
  return _stream(x, y), _stream(ex, ey)


class _Indexed:
  """A random-access source whose __getitem__ returns a list of sequences per batch."""

  def __init__(self, x, y):
    self.x, self.y = x, y

  def __len__(self):
    return len(self.y)

  def __getitem__(self, indices):
    return [self.x[i] for i in indices], self.y[indices]


def indexed_sequences(data_config, seed):
  del seed
  (x, y), (ex, ey) = _splits(data_config)
  return _Indexed(x, y), _Indexed(ex, ey)


def mixed_dtypes(data_config, seed):
  """Element 7 is float64, the others int32."""
  (x, y), evaluation = _splits(data_config)
  x[7] = x[7].astype(np.float64)
  return (x, y), evaluation


def mixed_ranks(data_config, seed):
  """Element 3 is [L, 2], the others [L]."""
  (x, y), evaluation = _splits(data_config)
  x[3] = np.stack([x[3], x[3]], axis=-1)
  return (x, y), evaluation


def padded_batch_stream(data_config, seed):
  """The stream as a tutorial writes it: padded_batch()'d already."""
  make_dataset, evaluation = stream_sequences(data_config, seed)
  return lambda: make_dataset().padded_batch(8), evaluation


def ragged_stream(data_config, seed):
  """Each example a RaggedTensor [2, None]."""
  def make_dataset():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tokens = tf.ragged.constant([[[1, 2], [3]], [[4], [5, 6, 7]]])
    return tf.data.Dataset.from_tensor_slices((tokens, tf.constant([0, 1], tf.int64)))
  return make_dataset, _splits(data_config)[1]


def masked_mean(model_config, input_spec):
  """Embedding(mask_zero=True) -> masked mean -> logits; the input [batch, length] of
  any length (the export serves new lengths)."""
  if isinstance(input_spec, dict):
    input_spec = input_spec["tokens"]
    inputs = {"tokens": keras.Input(shape=(None,), dtype=input_spec.dtype, name="tokens")}
    tokens = inputs["tokens"]
  else:
    inputs = tokens = keras.Input(shape=(None,), dtype=input_spec.dtype)
  embedded = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(tokens)
  pooled = keras.layers.GlobalAveragePooling1D()(embedded)
  return keras.Model(inputs, keras.layers.Dense(2)(pooled))


def from_input_spec(model_config, input_spec):
  """Embedding(mask_zero=True) -> GRU -> logits, its input shaped as `input_spec` says, as
  a user writes it (keras.Input(shape=input_spec.shape[1:])): a length fixed there is the
  GRU's number of steps in the export."""
  del model_config
  tokens = keras.Input(shape=input_spec.shape[1:], dtype=input_spec.dtype)
  embedded = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(tokens)
  return keras.Model(tokens, keras.layers.Dense(2)(keras.layers.GRU(8)(embedded)))


def from_input_spec_reference(arrays: dict, tokens):
  """from_input_spec's probabilities for `tokens` of any length, from its weights
  {path: array} (a checkpoint's; each of its weights has a shape of its own)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = from_input_spec(None, tf.TensorSpec([None, None], tf.int32))
  by_shape = {value.shape: value for key, value in arrays.items()
              if "seed_generator" not in key}  # the GRU's dropout seed is (2,) too
  for weight in model.weights:
    weight.assign(by_shape[tuple(weight.shape)])
  return tf.nn.softmax(model(tf.constant(tokens), training=False)).numpy()


class _LengthProbe(keras.layers.Layer):
  """Passes its input on, appending each training batch's length (axis 1) to the file
  named by DISTLOOP_TEST_LENGTHS: what training fed the model (the export's check serves
  it other lengths on purpose: those are not recorded)."""

  def call(self, x, training=None):
    import os  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if training:
      tf.print(tf.shape(x)[1], output_stream=f"file://{os.environ['DISTLOOP_TEST_LENGTHS']}")
    return x


def recording_model(model_config, input_spec):
  """masked_mean, recording the padded length of every batch it sees."""
  tokens = keras.Input(shape=(None,), dtype=input_spec.dtype)
  embedded = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(_LengthProbe()(tokens))
  pooled = keras.layers.GlobalAveragePooling1D()(embedded)
  return keras.Model(tokens, keras.layers.Dense(2)(pooled))
