"""Token sequences of 5..200, each replica's batch padded to its own longest (length grouping
off), Embedding(mask_zero) -> masked mean: each replica's sparse gradient has its own row
count, and repeats tokens. Clipped by global norm (binding on every step), so a norm that
counts a repeated row twice shows too."""
from tests.guarantees.workload import SGD, Workload, served_sequences

WORKLOAD = Workload("variable_length",
                    ("--config=synthetic",
                     "--config.model.name=tests.plugins.sequence_plugins:masked_mean",
                     "--config.data.name=tests.plugins.sequence_plugins:numpy_sequences",
                     "--config.data.pad_to=longest",
                     "--config.data.bucket_window=0",
                     "--config.train.clip_grad_norm=0.05", *SGD),
                    served=served_sequences)
