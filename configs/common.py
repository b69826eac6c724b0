"""Every default of every field; experiment configs start here and change a few.

The trainer reads `config.x` and never `config.get("x", default)`: a field that
is not here does not exist (the config is locked, so a typo on the command line
is an error, not a silently ignored flag).
"""
import ml_collections


def base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  config.model = ml_collections.ConfigDict()
  config.model.name = "mnist_cnn"      # mnist_cnn | mlp | tabular, or MODULE:FUNCTION (your own builder)
  config.model.num_classes = 0         # mnist_cnn, mlp: outputs (logits) of the last layer; 0 = from the data (class folders, MNIST's 10, largest integer label + 1)
  config.model.conv_filters = 32       # mnist_cnn: filters of the 3x3 convolution
  config.model.dense_units = 64        # mnist_cnn: units of the hidden dense layer
  config.model.mlp_units = 128         # mlp: units of the hidden dense layer
  config.model.dropout_rate = 0.2      # mlp: dropout after the hidden layer
  config.model.hidden_units = 16       # tabular: units of the hidden dense layer
  config.model.embedding_dim = 512     # recommender: width of the user and item embeddings
  config.model.num_outputs = 1         # tabular: outputs of the last layer (1: a logit or a value)

  config.data = ml_collections.ConfigDict()
  config.data.name = "synthetic"       # synthetic | mnist | fashion_mnist | tabular | regression | image_folder | records, or MODULE:FUNCTION
  config.data.dir = ""                 # the data's files (per pipeline); mnist: "" = Keras download/cache; records: python -m input_pipelines.convert's --output
  config.data.preprocess = ""          # MODULE:FUNCTION(features, labels, seed) per training example; "" = none
  config.data.pad_to = ""              # examples whose length varies: "" = refuse them | "longest" (each batch padded to its longest) | "32,64,128" (bucket boundaries: padded up to the smallest boundary that holds the batch's longest; longer ones to their longest)
  config.data.pad_value = 0.0          # pad_to: the value padding fills in (Keras Embedding(mask_zero=True) masks 0)
  config.data.bucket_window = 16       # pad_to, examples of varying length: training batches grouped by length within windows of this many global batches (sorted, then the batches shuffled), so short examples share short padding; 0 = no grouping. Fixes the order: a resume keeps it and train.global_batch_size
  config.data.num_train_examples = 10_000  # synthetic only: size of the training split
  config.data.num_eval_examples = 2_000    # synthetic only: size of the test split
  config.data.num_users = 50_000       # recommender: user ids 0..num_users-1 (the user table: num_users x model.embedding_dim floats)
  config.data.num_items = 1_000        # recommender: item ids 0..num_items-1
  config.data.num_features = 10        # tabular, regression (synthetic): features per row
  config.data.label_column = "label"   # tabular, regression (CSV): the column holding the label
  config.data.eval_fraction = 0.2      # tabular, regression, image_folder: held-out share when there is no test split
  config.data.image_size = 32          # image_folder: every image is resized to image_size x image_size
  config.data.channels = 3             # image_folder: 3 (RGB) or 1 (grayscale)

  config.train = ml_collections.ConfigDict()
  config.train.task = ""               # "" = the built-in supervised step (model, loss, metrics below) | MODULE:FUNCTION returning a trainer.Task (or a Task class): your own step
  config.train.actions = ""            # comma-separated MODULE:FUNCTION, each FUNCTION(config) -> trainer.Action(s): your code at loop boundaries (README: Actions)
  config.train.steps = 300             # total optimizer steps of the run
  config.train.epochs = 0.0            # instead of train.steps (then 0): passes over the training split, in examples used; steps = ceil((epochs * examples - examples used) / global_batch_size) more
  config.train.global_batch_size = 64  # examples per step, summed over all replicas
  config.train.steps_per_loop = 50     # steps compiled into one tf.function call (logging granularity)
  config.train.accumulation_steps = 1  # the built-in step: each replica's batch as this many micro-batches, gradients summed, one reduction and one update per step
  config.train.loss = "sparse_categorical_crossentropy"  # | binary_crossentropy | mean_squared_error | mean_absolute_error | MODULE:FUNCTION; a multi-output model: one for all, or OUTPUT=LOSS,... per output
  config.train.loss_weights = ""       # a multi-output model: OUTPUT=WEIGHT,... (the loss is the weighted sum); an output not named weighs 1
  config.train.from_logits = "auto"    # cross-entropies: "auto" (a final softmax/sigmoid -> probabilities, else logits) | "true" (logits) | "false" (probabilities)
  config.train.optimizer = "adam"      # sgd | momentum | adam | adamw | adamax | nadam | rmsprop | adagrad | adadelta | adafactor | ftrl | lamb | lion | MODULE:FUNCTION(train_config) -> keras optimizer
  config.train.optimizer_args = ""     # built-in optimizers: more keyword arguments, "beta_2=0.95,amsgrad=True"
  config.train.weight_decay = 0.0      # decoupled weight decay (Keras's weight_decay), any built-in optimizer; 0 = none (adamw: Keras's 0.004)
  config.train.weight_decay_exclude = "1d"  # variables never decayed: 1d (rank <= 1: biases, normalization scales) and/or regexes searched in variable paths, comma-separated; "" = none
  config.train.ema_decay = 0.0         # keep an exponential moving average of the weights (Keras's use_ema, ema_momentum); 0 = off
  config.train.ema_eval = True         # with a moving average: eval, keep-best and export use it (false: the trained weights)
  config.train.learning_rate = 1e-3    # constant learning rate
  config.train.momentum = 0.9          # momentum and rmsprop only
  config.train.lr_schedule = "constant"  # constant | cosine (warmup, then decay to 0 at train.steps) | step | MODULE:FUNCTION(train_config) -> float or LearningRateSchedule
  config.train.warmup_steps = 0        # cosine: linear warmup from 0 over this many steps
  config.train.lr_decay_steps = 1000   # step: multiply the rate by lr_decay_rate every this many steps
  config.train.lr_decay_rate = 0.1    # step: the factor
  config.train.lr_on_plateau = ml_collections.ConfigDict()  # train_and_eval: Keras's ReduceLROnPlateau at each eval (docs/sweeps.md)
  config.train.lr_on_plateau.factor = 0.0     # multiply the learning rate by this (0 < factor < 1) once `metric` has not improved for `patience` evals; 0 = off
  config.train.lr_on_plateau.metric = "loss"  # "loss" or a name from eval.metrics (or a Task's eval_step)
  config.train.lr_on_plateau.mode = "min"     # min (lower is better) | max
  config.train.lr_on_plateau.patience = 10    # evals in a row without improvement before a reduction
  config.train.lr_on_plateau.min_delta = 1e-4  # an improvement smaller than this does not count
  config.train.lr_on_plateau.cooldown = 0     # evals after a reduction during which none counts as without improvement
  config.train.lr_on_plateau.min_lr = 0.0     # train.learning_rate * factor never goes below this (the factor never below min_lr / train.learning_rate; the schedule on top)
  config.train.clip_grad_norm = 0.0    # clip the reduced gradient to this global norm; 0 = off
  config.train.report_gradient_norm = False  # also report the global norm of the reduced gradient (before clipping), averaged over each loop: gradient_norm (NAME_gradient_norm per named update). Off: ~5% of a tiny model's step, under 1% of a real one's
  config.train.nonfinite_policy = "stop"  # NaN/Inf loss or weights: stop (exit 1) | rollback
  config.train.max_rollbacks = 3       # rollback: times to restore the last good checkpoint and skip ahead
  config.train.action_timeout_seconds = 600.0  # a user Action (train.actions) that has not returned after this long ends the run (exit 1, one line naming it; the step saved on one process); 0 = no limit. A signal ends a blocked Action within seconds (exit 42)

  config.eval = ml_collections.ConfigDict()
  config.eval.interval = 100           # steps between evals in train_and_eval; 0 = only at the end
  config.eval.global_batch_size = 500  # examples per eval step; the last partial batch is evaluated too
  config.eval.metrics = "accuracy"     # comma-separated: accuracy, top_k_accuracy, binary_accuracy, mean_absolute_error, mean_squared_error, MODULE:FUNCTION; a multi-output model: OUTPUT=METRIC (reported as OUTPUT_METRIC)
  config.eval.top_k = 5                # top_k_accuracy: k
  config.eval.poll_seconds = 5.0       # continuous_eval: how often to look for new checkpoints
  config.eval.timeout_seconds = 3600.0 # continuous_eval: exit 1 if no new checkpoint for this long; 0 = wait forever

  config.predict = ml_collections.ConfigDict()
  config.predict.split = "eval"        # --mode=predict scores this split: eval | train
  config.predict.output = ""           # the predictions' folder; "" = MODEL_DIR/predictions/<step>/
  config.predict.global_batch_size = 500  # examples per predict step; the last partial batch too
  config.predict.chunk_rows = 10000    # rows per committed chunk (a Parquet file and a records shard): a stop or kill loses at most one

  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.interval = 100     # steps between checkpoints; the last step is always saved
  config.checkpoint.interval_seconds = 0.0  # also save when this much wall time passed since the last save (at a loop boundary); 0 = off
  config.checkpoint.max_to_keep = 3    # newest checkpoints kept on disk
  config.checkpoint.async_save = True  # write in the background while training goes on
  config.checkpoint.keep_period = 0    # also keep every step divisible by this forever; 0 = off
  config.checkpoint.keep_best = 0      # also keep the N best evals (checkpoint.best_metric) in checkpoints_best/; 0 = off
  config.checkpoint.best_metric = "accuracy"  # keep_best: "loss" or a name from eval.metrics
  config.checkpoint.best_mode = "max"  # keep_best: max (higher is better) | min
  config.checkpoint.early_stop_patience = 0  # train_and_eval: stop once best_metric has not improved for this many evals in a row; 0 = off
  config.checkpoint.early_stop_min_delta = 0.0  # early stopping: an improvement smaller than this does not count
  config.checkpoint.init_from = ""     # warm start: a model_dir or checkpoints/<step> to take weights from
  config.checkpoint.init_partial = False  # init_from: load only the variables whose name and shape match (a new head), list the rest; false = refuse any mismatch
  config.checkpoint.if_unreadable = "stop"  # no checkpoint readable: stop (exit 2, nothing moved) | start_over (set them aside in checkpoints_corrupt/, train from step 0)
  config.checkpoint.lease_seconds = 60.0  # a gs:// or s3:// model_dir: the writer's lease on it expires this long after its holder last renewed it (a SIGKILLed trainer's, say); the next run then takes it over (docs/scaling-out.md)
  config.checkpoint.allow_other_trajectory = False  # a resume on another replica count of a model whose trajectory depends on it (unsynchronized BatchNorm; randomness not drawn per example): refused unless true (docs/fault-tolerance.md)

  config.runtime = ml_collections.ConfigDict()
  config.runtime.strategy = "default"  # default | one_device | mirrored | multi_worker_mirrored | parameter_server | central_storage | tpu
  config.runtime.num_cpu_devices = 1   # logical CPU devices, so `mirrored` runs data-parallel on a CPU-only machine
  config.runtime.seed = 0              # weights, data order and dropout all follow from it
  config.runtime.deterministic = False # bit-reproducible kernels (tf.config.experimental.enable_op_determinism), and threads per op fixed by intra_op_threads
  config.runtime.intra_op_threads = 0  # threads per op (TF's intra-op pool; the summation order follows it); 0 = auto: 1 under deterministic, else the process's cores / num_cpu_devices; at most max(1024, cores)
  config.runtime.all_reduce_bytes_per_pack = 0        # gradient all-reduce packing; 0 = one pack
  config.runtime.all_reduce_implementation = "auto"   # auto | ring | nccl (multi-worker collectives)
  config.runtime.loggers = "tensorboard,csv"  # where the run reports (trainer/reporters/): tensorboard, csv (metrics.csv), mlflow, wandb, MODULE:CLASS (a trainer.Reporter of yours); comma-separated
  config.runtime.wandb_project = "distloop"  # loggers=wandb: the W&B project (entity, mode, key: W&B's own WANDB_* variables); needs pip install -e '.[wandb]'
  config.runtime.wandb_export = False  # loggers=wandb: also log the exported SavedModel as a W&B model artifact
  config.runtime.mlflow_uri = ""       # log params, metrics and the export to this MLflow tracking URI (http://HOST:PORT, sqlite:///PATH, ...; adds mlflow to runtime.loggers); needs pip install -e '.[mlflow]'; "" = off
  config.runtime.mlflow_experiment = "distloop"  # mlflow_uri: the MLflow experiment of the run
  config.runtime.profile_steps = ""   # "START,END": a tf.profiler trace of those steps into tensorboard/
  config.runtime.jit_compile = "auto"  # XLA for the whole step: "true" | "false" | "auto" (= on GPU/TPU, off on CPU: measured)
  config.runtime.mixed_precision = "float32"  # float32 | bfloat16 | float16 (with dynamic loss scaling)
  config.runtime.variable_partitioner = ""  # parameter_server: split large variables over the servers along axis 0: "" = none | fixed:<shards> | min_size:<bytes> (shards of at least that size) | max_size:<bytes> (shards of at most that size); never more shards than servers
  config.runtime.slurm_port_base = 8888  # Slurm clusters: the first gRPC port on every node
  return config
