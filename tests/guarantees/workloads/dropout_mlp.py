"""The built-in MLP (Dropout 0.2), a Keras random layer drawn per example: the same masks
on any replica count (trainer/task/randomness.py)."""
from tests.guarantees.workload import SGD, XLA_RANDOM, Workload, served_cnn

WORKLOAD = Workload("dropout_mlp", ("--config=synthetic", "--config.model.name=mlp", *SGD),
                    served=served_cnn,  # measured 3.0e-8 (2, central_storage): AGREE_DEFAULT
                    not_applicable={("shapes_agree", "xla-1"): XLA_RANDOM})  # measured 7.3e-3
