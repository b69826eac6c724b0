"""A CNN with (unsynchronized) BatchNormalization: each replica normalizes its own share, so
its trajectory depends on the replica count, and an elastic resume is refused."""
from tests.guarantees.workload import SGD, Workload, refused_on_two_replicas, served_batchnorm

# What the refusal of an elastic resume names (trainer/analysis/replica_dependence.py), and why.
REFUSAL = "BatchNormalization 'bn' (unsynchronized"
_REPLICAS = ("BatchNormalization normalizes each replica's own share in training "
             "(Keras synchronized=False)")

WORKLOAD = Workload("conv_batchnorm",
                    ("--config=synthetic",
                     "--config.model.name=tests.plugins.batchnorm_plugins:conv_batchnorm",
                     "--config.data.name=tests.plugins.batchnorm_plugins:images", *SGD),
                    served=served_batchnorm,
                    agree_within={"xla-1": 2e-6},  # measured 6.4e-7: XLA fuses the normalization
                    refuses_elastic=REFUSAL,
                    not_applicable=refused_on_two_replicas(_REPLICAS, REFUSAL))
