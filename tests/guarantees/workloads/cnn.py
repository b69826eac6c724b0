"""The built-in supervised step: the CNN on synthetic MNIST-shaped data, its learning rate
halved by train.lr_on_plateau at the evals of 20, 30 and 40 (an accuracy gain must exceed 1:
only the first eval sets a best), so every check also holds the plateau's factor: the
SIGKILLed run resumes step 30 at a factor of 0.25, every shape drops it at the same evals,
and `python -m trainer.verify` judges its trajectory (tests/loop/test_lr_on_plateau.py checks
that it drops)."""
from tests.guarantees.workload import SGD, Workload, served_cnn

PLATEAU = ("--config.train.lr_on_plateau.factor=0.5", "--config.train.lr_on_plateau.patience=1",
           "--config.train.lr_on_plateau.metric=accuracy",
           "--config.train.lr_on_plateau.mode=max", "--config.train.lr_on_plateau.min_delta=1")

WORKLOAD = Workload("cnn", ("--config=synthetic", "--config.model.conv_filters=8",
                            "--config.model.dense_units=16", *SGD, *PLATEAU),
                    served=served_cnn, donor="softmax_head")
