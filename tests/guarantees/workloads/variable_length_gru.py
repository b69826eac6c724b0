"""The same tokens into a GRU whose Input takes its shape from input_spec, grouped by length
(data.bucket_window's default) and padded up to bucket boundaries: every replica padded to
the global batch's boundary (4 lengths: whole-step XLA compiles 4 steps, not one per batch
as `longest` would make it)."""
import keras

from tests.guarantees.workload import SGD, Workload, served_sequences


def embedding_gru(model_config, input_spec):
  """Embedding(mask_zero) -> GRU -> logits, its Input shaped by `input_spec` as a user
  writes it: the builder is told what length the data has (None: any)."""
  del model_config
  tokens = keras.Input(shape=input_spec.shape[1:], dtype=input_spec.dtype)
  embedded = keras.layers.Embedding(50, 8, mask_zero=True)(tokens)
  return keras.Model(tokens, keras.layers.Dense(2)(keras.layers.GRU(8)(embedded)))


WORKLOAD = Workload(
    "variable_length_gru",
    ("--config=synthetic",
     "--config.model.name=tests.guarantees.workloads.variable_length_gru:embedding_gru",
     "--config.data.name=tests.plugins.sequence_plugins:numpy_sequences",
     "--config.data.pad_to=50,100,150,200", *SGD),
    served=served_sequences,
    refuses_change=("length grouping (data.bucket_window) fixes the batches: a "
                    "resume cannot change train.global_batch_size"))
