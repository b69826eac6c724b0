"""RandomFlip + RandomRotation on the images, a Conv and Dropout: each example's flip, angle
and mask its own on any replica count."""
from tests.guarantees.workload import EVERY_CHECK, SGD, Workload, served_cnn

_XLA_ROTATION = ("RandomRotation's ImageProjectiveTransformV3 has no XLA kernel: whole-step "
                 "XLA cannot compile the step (TensorFlow's limit; the run fails its first loop)")

WORKLOAD = Workload("augmented", ("--config=synthetic",
                                  "--config.model.name=tests.plugins.shape_plugins:augmented",
                                  *SGD),
                    served=served_cnn,
                    # measured 4.2e-7 (2, central_storage); elastic 1.7e-7
                    agree_within={"2": 8e-7, "central_storage-2": 8e-7},
                    not_applicable={(EVERY_CHECK, "xla-1"): _XLA_ROTATION})
