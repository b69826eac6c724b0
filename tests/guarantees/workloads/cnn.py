"""The built-in supervised step: the CNN on synthetic MNIST-shaped data."""
from tests.guarantees.workload import SGD, Workload, served_cnn

WORKLOAD = Workload("cnn", ("--config=synthetic", "--config.model.conv_filters=8",
                            "--config.model.dense_units=16", *SGD),
                    served=served_cnn, donor="softmax_head")
