"""The planted bugs, one `Mutation` each: a real guarantee-breaking bug in trainer/ or
input_pipelines/, and the tests that must catch it (tests/mutations/__init__.py).

To add one: append an entry. `old` is text copied from the file, which must occur there
exactly once (make it longer until it does); `new` is the bug; `also` holds further
edits of the same bug; `slice` names the fastest tests that catch it (pytest node ids,
a parametrized test with its id in brackets; `python -m pytest --collect-only -q FILE`
lists them). Check it with `python -m tests.mutations --only NAME --baseline`, then
regenerate docs/testing.md's table (`python -m tests.mutations --markdown`).
"""
from tests.mutations import Edit, Mutation

_SAME_WEIGHTS_2 = ("tests/setup/test_user_plugins.py::test_same_weights_on_several_replicas_with_"
                   "plain_sgd[2]")
_LAYER_ATTRIBUTES_RESUME = ("tests/tasks/test_task_state.py::test_state_beyond_top_level_models_is_"
                            "saved_and_a_resume_equals_the_run[LayerAttributes-keys0]")
_SIGTERM_CONFIGURED_CODE = ("tests/cluster/test_preempted_exit_code.py::test_sigterm_exits_with_the_"
                            "configured_code_and_the_same_command_resumes")
_EPOCH_PERMUTATION = ("tests/pipelines/test_batching.py::test_each_epoch_is_a_permutation_that_depends_on_"
                      "seed_and_epoch")

CATALOGUE = [
    # -- the one gradient reduction, the global-batch loss --------------------------------
    Mutation(
        name="gradient_reduced_twice",
        plants="the replicas' gradients are all-reduced a second time (2x the gradient on 2 "
               "replicas)",
        file="trainer/task/contexts.py",
        old="reduced = _all_sum(context, gradients, self._communication_options)",
        new="reduced = _all_sum(context, _all_sum(context, gradients, "
            "self._communication_options), self._communication_options)",
        slice=(_SAME_WEIGHTS_2,)),
    Mutation(
        name="loss_over_replica_batch",
        plants="the loss is divided by the per-replica batch, not the global batch",
        file="trainer/task/contexts.py",
        old="global_batch_size=self.global_batch_size)",
        new="global_batch_size=self.global_batch_size // self.num_replicas)",
        slice=(_SAME_WEIGHTS_2,)),
    Mutation(
        name="central_storage_without_first_replica_rule",
        plants="under central_storage a variable each replica assigns (Dropout's seed) keeps "
               "aggregation NONE (commit 42b8b60's rule removed)",
        file="trainer/loop/steps.py",
        old='      kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA\n',
        new="      pass\n",
        slice=("tests/cluster/test_multi_worker.py::test_central_storage_trains_like_mirrored_with_state_"
               "each_replica_assigns[dropout]",)),
    Mutation(
        name="replicas_keep_their_own_statistics",
        plants="the replicas' copies of BatchNorm's moving statistics never agree on the first "
               "replica's (eval and checkpoint disagree)",
        file="trainer/loop/steps.py",
        old="    if local:\n      strategy.run(lambda: replicas_agree(local))\n",
        new="",
        slice=("tests/outputs/test_batchnorm_eval.py::test_two_replicas_report_the_eval_of_their_"
               "checkpoint",)),

    # -- the checkpoint and the resume ----------------------------------------------------
    Mutation(
        name="task_state_left_out_of_checkpoint",
        plants="the checkpoint leaves out the task's own state (state/...: the layers, "
               "variables and random generators it holds beside its models)",
        file="trainer/state/train_state.py",
        old="    model_tree = checkpoints.variables_tree(self._model_variables)\n"
            "    optimizer_tree = checkpoints.variables_tree(self._optimizer_variables)\n"
            "    bad =",
        new="    model_tree = checkpoints.variables_tree({key: variable for key, variable in "
            "self._model_variables.items() if not key.startswith('state/')})\n"
            "    optimizer_tree = checkpoints.variables_tree(self._optimizer_variables)\n"
            "    bad =",
        slice=("tests/tasks/test_task_state.py::test_variables_held_in_a_list_are_saved_once_and_a_"
               "resume_equals_the_run",)),
    Mutation(
        name="resume_skips_a_batch",
        plants="a resumed run starts one global batch after the checkpointed data position",
        file="trainer/state/train_state.py",
        old='return Position(step, int(meta["examples_consumed"])), None',
        new='return Position(step, int(meta["examples_consumed"]) + '
            'self._config.train.global_batch_size), None',
        slice=(_LAYER_ATTRIBUTES_RESUME,)),
    Mutation(
        name="resume_lr_schedule_one_step_ahead",
        plants="a restore puts the optimizer's step count one ahead (the learning-rate schedule "
               "is off by one step after a resume)",
        file="trainer/state/train_state.py",
        old="    checkpoints.assign_tree(optimizer_variables, optimizer_tree)\n",
        new="    checkpoints.assign_tree(optimizer_variables, optimizer_tree)\n"
            "    for key, variable in optimizer_variables.items():\n"
            "      if key.endswith('/iteration'):\n"
            "        variable.assign_add(1)\n",
        slice=("tests/tasks/test_task_state.py::test_a_resume_continues_the_learning_rate_schedule_"
               "at_its_step",)),
    Mutation(
        name="checkpoint_other_shapes_accepted",
        plants="a checkpoint whose variables have other shapes is not refused (warm start, resume)",
        file="trainer/state/checkpoints.py",
        old="    if stored[key] != wanted[key]:",
        new="    if False:",
        slice=("tests/state/test_checkpoint_recovery.py::test_warm_start_from_another_model_is_"
               "refused",)),
    Mutation(
        name="fixed_field_may_change_on_resume",
        plants="runtime.seed (the data order) is no longer a field a resume must keep",
        file="trainer/state/config_changes.py",
        old='    "runtime.seed": "the data order (and synthetic data)",\n',
        new="",
        slice=("tests/setup/test_resume_config.py::test_which_fields_a_resume_may_change",
               "tests/setup/test_resume_config.py::test_changing_a_fixed_field_on_resume_is_refused"
               "[--config.runtime.seed=1-runtime.seed-0-1]")),
    Mutation(
        name="collector_left_off",
        plants="the garbage collector paused for TensorFlow's first import is never turned on "
               "again: a training grows by every reference cycle it makes",
        file="trainer/cluster/first_import.py",
        old="  finally:\n    gc.enable()\n",
        new="  finally:\n    pass\n",
        slice=("tests/cluster/test_first_import.py",)),
    Mutation(
        name="writer_lock_shared",
        plants="the store's lock is a shared flock: two trainers may write one model_dir "
               "(two predicts one output)",
        file="trainer/store/files.py",
        old="fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        new="fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        slice=("tests/state/test_one_writer.py::test_lock_unit",)),
    Mutation(
        name="non_finite_state_saved",
        plants="non-finite loss or weights neither stop the run nor are refused by the save: "
               "NaN becomes a checkpoint",
        file="trainer/loop/controller.py",
        old="      if non_finite or not bool(state_finite):\n",
        new="      if False:\n",
        also=(Edit("trainer/state/train_state.py", "    if bad:\n", "    if False:\n"),),
        slice=("tests/loop/test_non_finite.py::test_divergence_stops_and_checkpoints_stay_finite",)),
    Mutation(
        name="save_guard_removed",
        plants="the save itself no longer refuses non-finite state (only the loop's check is "
               "left)",
        file="trainer/state/train_state.py",
        old="    if bad:\n",
        new="    if False:\n",
        slice=("tests/state/test_train_state.py::test_the_save_itself_refuses_non_finite_state",)),
    Mutation(
        name="resume_from_the_oldest_checkpoint",
        plants="a resume restores the oldest readable checkpoint, not the newest",
        file="trainer/state/train_state.py",
        old="    return earlier[-1] if earlier else -1",
        new="    return earlier[0] if earlier else -1",
        slice=("tests/setup/test_python_api.py::test_one_process_trains_resumes_and_trains_another_"
               "config",)),
    Mutation(
        name="rollback_rereads_the_bad_batches",
        plants="a rollback restores the checkpoint but re-reads the data that diverged instead "
               "of skipping past it",
        file="trainer/loop/value_checks.py",
        old="    return Position(restored.step, reached.examples)",
        new="    return restored",
        slice=("tests/state/test_checkpoint_recovery.py::test_rollback_restores_and_skips_ahead_until_"
               "its_budget_is_spent",)),

    # -- preemption -----------------------------------------------------------------------
    Mutation(
        name="preempted_exits_0",
        plants="a run stopped by SIGTERM exits 0 (done) instead of 42 / --preempted_exit_code",
        file="trainer/cli/main.py",
        old="    _report_preempted(e)\n    _leave(errors.preempted_exit_code())",
        new="    _report_preempted(e)\n    _leave(0)",
        slice=(_SIGTERM_CONFIGURED_CODE,)),
    Mutation(
        name="sigterm_save_skipped",
        plants="SIGTERM during training exits 42 without saving the current step",
        file="trainer/loop/controller.py",
        old="    try:\n      self.save(position)\n      self.train_state.wait()\n",
        new="    try:\n      self.train_state.wait()\n",
        slice=(_SIGTERM_CONFIGURED_CODE,)),
    Mutation(
        name="preempted_loop_not_logged",
        plants="the loop behind a SIGTERM saves its step and exits 42 before logging its train "
               "values: metrics.csv and TensorBoard never hold that step (issue 57)",
        file="trainer/loop/boundary.py",
        old="    self._progress_report.report(boundary)\n    self._save_and_stop(boundary.position)",
        new="    self._save_and_stop(boundary.position)",
        slice=("tests/loop/test_preempted_metrics.py::test_each_loop_logged_once_across_sigterms",)),

    # -- the data order and the batches ---------------------------------------------------
    Mutation(
        name="order_ignores_epoch",
        plants="every epoch reads the same permutation of the data",
        file="input_pipelines/order.py",
        old="tf.fill(tf.shape(positions), seed), epochs], axis=1)",
        new="tf.fill(tf.shape(positions), seed), tf.zeros_like(epochs)], axis=1)",
        slice=(_EPOCH_PERMUTATION,)),
    Mutation(
        name="order_ignores_seed",
        plants="runtime.seed does not change the data order",
        file="input_pipelines/order.py",
        old="tf.fill(tf.shape(positions), seed), epochs], axis=1)",
        new="tf.fill(tf.shape(positions), tf.constant(0, tf.int64)), epochs], axis=1)",
        slice=(_EPOCH_PERMUTATION,)),
    Mutation(
        name="replicas_read_the_same_rows",
        plants="every replica reads the first replica's share of each global batch",
        file="input_pipelines/batching.py",
        old="    first = start_example + step * global_batch_size + replica * per_replica\n",
        new="    first = start_example + step * global_batch_size\n",
        slice=("tests/pipelines/test_batching.py::test_each_input_pipeline_builds_its_replicas_share_of_"
               "every_global_batch[1-2]",)),
    Mutation(
        name="stream_resume_starts_over",
        plants="a tf.data stream source resumes from its first example, not its checkpointed "
               "position",
        file="input_pipelines/batching.py",
        old="repeat().skip(start_example)",
        new="repeat().skip(0)",
        slice=("tests/pipelines/test_batching.py::test_a_stream_source_resumes_by_skipping_to_its_"
               "position",)),
    Mutation(
        name="bucketed_batches_without_static_rows",
        plants="length-grouped training batches lose their static row count (tf.ensure_shape of "
               "commit 7a346c9 removed)",
        file="input_pipelines/batching.py",
        old="lambda t: tf.ensure_shape(t, [per_replica, *t.shape[1:]]), (features, labels))",
        new="lambda t: t, (features, labels))",
        slice=("tests/pipelines/test_bucketing.py::test_grouped_batches_have_their_rows_when_traced",)),
    Mutation(
        name="preprocess_seed_ignores_position",
        plants="data.preprocess gets the same seed for every example (augmentation not random "
               "per example)",
        file="input_pipelines/batching.py",
        old="position]))",
        new="position * 0]))",
        slice=("tests/pipelines/test_batching.py::test_preprocess_is_random_per_example_yet_the_same_"
               "after_a_resume",)),

    # -- eval: every example once, exact means --------------------------------------------
    Mutation(
        name="eval_drops_partial_batch",
        plants="eval leaves out its final partial batch",
        file="input_pipelines/batching.py",
        old="num_batches = -(-num_examples // global_batch_size)",
        new="num_batches = num_examples // global_batch_size",
        slice=("tests/outputs/test_eval_exact.py::test_three_replicas_count_every_example_once",)),
    Mutation(
        name="eval_replicas_read_the_same_slice",
        plants="every replica evaluates the first replica's slice of each eval batch",
        file="input_pipelines/batching.py",
        old="first = tf.minimum(step * global_batch_size + replica * per_replica, end)",
        new="first = tf.minimum(step * global_batch_size, end)",
        slice=("tests/pipelines/test_batching.py::test_eval_shares_cover_every_example_once_with_empty_"
               "slices[1-3]",)),
    Mutation(
        name="eval_mean_of_batch_means",
        plants="eval values are divided by the number of (replica) batches, not the example "
               "count",
        file="trainer/loop/steps.py",
        old="      sums.append(value * count if value.shape.rank == 0 else\n"
            "                  tf.reduce_sum(",
        new="      sums.append(value if value.shape.rank == 0 else\n"
            "                  tf.reduce_mean(",
        also=(Edit("trainer/loop/steps.py", "    return tf.stack([count, *sums])",
                   "    return tf.stack([tf.ones_like(count), *sums])"),),
        slice=("tests/outputs/test_eval_exact.py::test_one_replica_scores_the_same_checkpoint_"
               "identically",)),
    Mutation(
        name="eval_runs_the_model_on_empty_slices",
        plants="a replica's empty slice of the last eval batch runs the model (oneDNN's "
               "Conv->BatchNorm fails on it)",
        file="trainer/loop/steps.py",
        old="tf.cond(size > 0, lambda: add_batch(features, labels, running), lambda: running)",
        new="add_batch(features, labels, running)",
        slice=("tests/outputs/test_batchnorm_eval.py::test_conv_batchnorm_two_replicas_with_an_empty_"
               "slice[1]",)),

    # -- the step's randomness ----------------------------------------------------------
    Mutation(
        name="replicas_draw_the_same_noise",
        plants="step.normal / uniform / example_seeds give every replica the first replica's "
               "rows of the global batch's draw",
        file="trainer/task/contexts.py",
        old="    return values[replica * rows:(replica + 1) * rows]",
        new="    return values[:rows]",
        slice=("tests/tasks/test_task_helpers.py::test_example_seeds_do_not_change_with_the_replica_"
               "count",)),

    Mutation(
        name="random_layers_drawn_per_replica",
        plants="Keras's random layers (Dropout, RandomFlip, RandomRotation) draw over each "
               "replica's own batch: replica 1 of 2 reuses replica 0's masks",
        file="trainer/task/randomness.py",
        old="    return [global_batch, *dims[1:]], tf.cast(replica, tf.int32) * rows, rows\n",
        new="    return None\n",
        slice=("tests/guarantees/test_matrix.py::test_every_shape_trains_the_weights_of_one_"
               "replica[dropout_mlp-2]",
               "tests/guarantees/test_matrix.py::test_a_resume_on_another_replica_count_keeps_"
               "the_trajectory_or_is_refused[dropout_mlp-2]")),

    # -- the moving average ---------------------------------------------------------------
    Mutation(
        name="ema_not_served",
        plants="eval and export use the trained weights, not the moving average "
               "(train.ema_decay)",
        file="trainer/loop/serving.py",
        old="    if self._config.train.ema_eval:\n      return self._state.averaged_weights()\n",
        new="",
        slice=("tests/loop/test_optimizers.py::test_the_moving_average_is_evaluated_and_exported_and_"
               "training_goes_on_from_the_weights",)),
    Mutation(
        name="ema_left_in_place_of_the_weights",
        plants="after eval or export the weights keep the moving average (training goes on "
               "from it)",
        file="trainer/task/optimizers.py",
        old="    for (variable, _), value in zip(pairs, trained):\n      variable.assign(value)\n",
        new="    pass\n",
        slice=("tests/loop/test_optimizers.py::test_the_moving_average_is_served_in_place_and_the_"
               "weights_come_back",)),

    # -- the guarantee matrix's own blind spots (issue 43) --------------------------------
    Mutation(
        name="position_from_todays_batch",
        plants="the checkpoint's data position is step x today's batch size (wrong after a "
               "resume that changed train.global_batch_size)",
        file="trainer/state/train_state.py",
        old='"examples_consumed": position.examples,',
        new='"examples_consumed": position.step * self._config.train.global_batch_size,',
        slice=("tests/guarantees/test_matrix.py::test_resume_with_changed_fields_equals_the_run_"
               "with_that_change[cnn-1]",)),
    Mutation(
        name="moving_averages_not_checkpointed",
        plants="the optimizer's moving averages (EMA weights) are left out of the checkpoint",
        file="trainer/state/train_state.py",
        old="    self._optimizer_variables = optimizer_variables\n",
        new="    self._optimizer_variables = {key: variable for key, variable in "
            "optimizer_variables.items() if 'average' not in key}\n",
        slice=("tests/guarantees/test_matrix.py::test_sigterm_resume_equals_uninterrupted["
               "adamw_ema_accumulation-1]",)),
    Mutation(
        name="batchnorm_variance_not_checkpointed",
        plants="BatchNormalization's moving_variance is left out of the checkpoint",
        file="trainer/state/train_state.py",
        old="    self._model_variables = model_variables\n",
        new="    self._model_variables = {key: variable for key, variable in "
            "model_variables.items() if 'moving_variance' not in key}\n",
        slice=("tests/guarantees/test_matrix.py::test_sigterm_resume_equals_uninterrupted["
               "conv_batchnorm-1]",)),
    Mutation(
        name="threads_per_op_follow_the_devices",
        plants="under runtime.deterministic the threads per op are the process's device count "
               "(another summation order on another shape)",
        file="trainer/cluster/runtime.py",
        old="  if runtime_config.deterministic:\n    return 1\n",
        new="  if runtime_config.deterministic:\n    return max(1, runtime_config.num_cpu_devices)\n",
        slice=("tests/guarantees/test_matrix.py::test_the_summation_order_does_not_follow_the_"
               "devices[cnn-one_device-of-2]",)),
    Mutation(
        name="eval_skips_partial_batch_matrix",
        plants="eval leaves out its final partial batch (the matrix's own eval, 3 batches)",
        file="input_pipelines/batching.py",
        old="  num_batches = -(-num_examples // global_batch_size)\n",
        new="  num_batches = max(1, num_examples // global_batch_size)\n",
        slice=("tests/guarantees/test_matrix.py::test_export_equals_eval[cnn-1]",
               "tests/guarantees/test_matrix.py::test_eval_equals_mode_eval[cnn-1]")),

    # -- a model_dir on a bucket (issue 45) ---------------------------------------------------
    Mutation(
        name="bucket_marker_uploaded_with_the_step_files",
        plants="a step's commit marker goes into the bucket among its files (orbax's own "
               "commit_success.txt, uploaded in os.walk order), not after them: a kill "
               "mid-upload leaves a step that counts without its files",
        file="trainer/store/mirror.py",
        old="    self.push_tree(step_dir, skip=(marker,))\n",
        new="    self.push_tree(step_dir)\n",
        slice=("tests/guarantees/test_matrix.py::test_sigkill_resume_equals_uninterrupted["
               "cnn-1-s3]",)),
    Mutation(
        name="bucket_pull_ignores_the_marker",
        plants="staging a bucket model_dir takes every step it holds, a step without its "
               "commit marker (an upload cut short) included",
        file="trainer/store/mirror.py",
        old="      committed = {step for step, names in files.items()\n"
            "                   if f\"{directory}/{step}/{COMMIT_MARKER}\" in names}\n",
        new="      committed = set(files)\n",
        slice=("tests/guarantees/test_matrix.py::test_sigkill_resume_equals_uninterrupted["
               "cnn-1-s3]",)),
    # -- bucket retries and the lease's deadline (issue 57) -----------------------------
    Mutation(
        name="bucket_writes_retried_past_the_lease",
        plants="a lease holder's writes are retried for the whole retry bound, not only "
               "until its lease could be taken over: cut off at its commit, it puts its "
               "marker in the bucket after another trainer took over",
        file="trainer/store/object_stores.py",
        old="      writer = self.writer if write else None\n",
        new="      writer = None\n",
        slice=("tests/buckets/test_bucket_retries.py::test_a_holder_cut_off_at_its_commit_"
               "writes_nothing_after_its_deadline[gs]",)),
    Mutation(
        name="bucket_keras_seeds_from_the_global_random",
        plants="Keras draws its default seeds during the build from Python's global random, "
               "which a bucket client's requests draw from too: other weights on a bucket",
        file="trainer/cluster/runtime.py",
        old="  seed_generator.python_random = own\n",
        new="",
        slice=("tests/setup/test_keras_seeds.py::test_a_draw_from_the_global_random_before_"
               "the_build_changes_no_weight",
               "tests/buckets/test_bucket_model_dir.py::test_retried_faults_change_no_"
               "weight[gs]")),

    # -- --mode=predict: each row once (issue 47) ----------------------------------------
    Mutation(
        name="predictions_progress_reorders_the_columns",
        plants="progress.json is written with sorted keys: a resumed run's records take "
               "another column for their label, and their manifest other bytes",
        file="trainer/state/predictions.py",
        old="  files.write_json(path, value, indent=1, sort_keys=False, **where)  # the columns in order\n",
        new="  files.write_json(path, value, indent=1, sort_keys=True, **where)\n",
        slice=("tests/state/test_predictions_folder.py::test_a_rerun_keeps_committed_chunks_"
               "and_redoes_the_rest",)),
    Mutation(
        name="predictions_uncommitted_files_kept",
        plants="a rerun keeps the files of a chunk that a kill left uncommitted",
        file="trainer/state/predictions.py",
        old="        files.remove(os.path.join(folder, name))\n",
        new="        pass\n",
        slice=("tests/state/test_predictions_folder.py::test_a_rerun_keeps_committed_chunks_"
               "and_redoes_the_rest",)),
    Mutation(
        name="predictions_progress_before_the_rename",
        plants="progress.json names a chunk before its Parquet file is renamed into place: "
               "a kill between them leaves a committed chunk without its file",
        file="trainer/state/predictions.py",
        old="      files.commit(files.temporary(parquet_path), parquet_path, what=what, where=self.directory)\n"
            "      files.published(os.path.join(self.directory, RECORDS, records[\"file\"]))\n"
            "      _write_json(os.path.join(self.directory, PROGRESS), self._progress([*self.chunks, entry]),\n"
            "                  what=what, where=self.directory)\n",
        new="      _write_json(os.path.join(self.directory, PROGRESS), self._progress([*self.chunks, entry]),\n"
            "                  what=what, where=self.directory)\n"
            "      files.commit(files.temporary(parquet_path), parquet_path, what=what, where=self.directory)\n"
            "      files.published(os.path.join(self.directory, RECORDS, records[\"file\"]))\n",
        slice=("tests/state/test_predictions_folder.py::test_a_kill_inside_the_commit_window_"
               "leaves_no_chunk_named_before_its_files[2]",)),
    Mutation(
        name="predictions_input_not_checked",
        plants="a rerun keeps committed chunks without reading their input rows again: "
               "chunks of the old data and of the new mixed in one output",
        file="trainer/state/predictions.py",
        old="    if chunk.get(\"input\") != inputs(first, end):\n",
        new="    if False:\n",
        slice=("tests/state/test_predictions_folder.py::test_chunks_scored_on_other_input_rows_"
               "are_refused_untouched[2]",)),
    Mutation(
        name="predictions_damaged_chunk_kept",
        plants="a rerun keeps a committed chunk whose file is truncated or missing (its "
               "SHA-256 in progress.json never checked)",
        file="trainer/state/predictions.py",
        old="      if not os.path.isfile(path) or shards.file_sha256(path) != chunk[kind][\"sha256\"]:\n",
        new="      if not os.path.isfile(path):\n",
        slice=("tests/state/test_predictions_folder.py::test_a_damaged_committed_chunk_is_scored_"
               "again_with_a_warning[truncated-None]",)),
    Mutation(
        name="predictions_manifest_holds_timings",
        plants="manifest.json holds the run's seconds: a killed-and-rerun output is not "
               "the bytes of a clean one",
        file="trainer/state/predictions.py",
        old="                \"records\": RECORDS}\n",
        new="                \"records\": RECORDS, \"seconds\": __import__(\"time\").perf_counter()}\n",
        slice=("tests/state/test_predictions_folder.py::test_a_rerun_keeps_committed_chunks_"
               "and_redoes_the_rest",)),
    Mutation(
        name="predict_keeps_the_padding_rows",
        plants="the rows that top up a replica's slice (past the end, or of the next batch) "
               "are written as rows",
        file="trainer/loop/predict.py",
        old="      buffered.append(_columns(rows[keep], {n: v[keep] for n, v in values.items()},\n",
        new="      buffered.append(_columns(rows, values,\n",
        also=(Edit("trainer/loop/predict.py",
                   "    columns[name] = value[keep] if name in labelled else value\n",
                   "    columns[name] = value\n"),),
        slice=("tests/guarantees/test_matrix.py::test_predict_writes_each_row_once_the_same_"
               "bytes_on_every_shape[cnn-2]",)),
    Mutation(
        name="predict_noise_per_batch_position",
        plants="predict_step's noise is drawn by the row's place in its replica's batch, not "
               "by the row: it changes with the replica count and the batch",
        file="trainer/task/contexts.py",
        old="    return tf.stack([tf.fill(tf.shape(self.rows), base[0] * 1_000_003 + base[1]), self.rows],\n",
        new="    return tf.stack([tf.fill(tf.shape(self.rows), base[0] * 1_000_003 + base[1]), "
            "tf.range(tf.size(self.rows, out_type=tf.int64))],\n",
        slice=("tests/outputs/test_predict.py::test_gan_samples_are_a_function_of_the_row",)),

    # -- python -m trainer.verify and trainer.inspect: the certifier of a user's job --------
    Mutation(
        name="verify_judges_a_run_against_itself",
        plants="verify's resume checks read the reference's digests for both runs: checks "
               "that cannot fail",
        file="trainer/verify/judging.py",
        old="  ours, theirs = digests.read(reference), digests.read(chain)\n",
        new="  ours, theirs = digests.read(reference), digests.read(reference)\n",
        slice=("tests/verify/test_verify.py::test_a_planted_defect_is_named_by_its_check_step_"
               "and_variable[python_counter]",)),
    Mutation(
        name="verify_resume_tolerance_loosened",
        plants="verify's resume checks (judge_chain) let a difference of 1e-6 through while "
               "the report still says bit for bit",
        file="trainer/verify/judging.py",
        old="      judge_digests(check, ours, theirs, steps, 0.0)\n",
        new="      judge_digests(check, ours, theirs, steps, 1e-6)\n",
        slice=("tests/verify/test_judging.py::test_a_resume_that_parts_by_one_ulp_differs_bit_"
               "for_bit[6-sigkill]",)),
    Mutation(
        name="verify_evaluates_once_per_process",
        plants="verify leaves out its eval twice check: a Keras Mean a Task never resets "
               "passes every check",
        file="trainer/verify/checks.py",
        old="  return [*checks, _eval(job, reference), _eval_twice(job, reference), "
            "_export(job, reference)]\n",
        new="  return [*checks, _eval(job, reference), _export(job, reference)]\n",
        slice=("tests/verify/test_verify.py::test_a_planted_defect_is_named_by_its_check_step_"
               "and_variable[mean_never_reset_and_loss_over_the_replica_batch]",)),
    Mutation(
        name="verify_own_rounding_too_loose",
        plants="verify's bound from the job's own rounding is 1e6 times what the reordered "
               "run parts by: a gradient counted twice passes as a sensitive job",
        file="trainer/verify/judging.py",
        old="OWN_ROUNDING_FACTOR = 10.0\n",
        new="OWN_ROUNDING_FACTOR = 1e6\n",
        slice=("tests/verify/test_judging.py::test_a_job_more_sensitive_to_the_summation_order_"
               "is_judged_by_its_own_rounding[gradient_counted_twice]",)),
    Mutation(
        name="verify_rounding_bound_too_loose",
        plants="verify's bound on another replica count is 1e-3 a step, not float32 rounding: "
               "a loss over the replica's batch passes",
        file="trainer/verify/judging.py",
        old="ROUNDING_PER_STEP = 2e-7\n",
        new="ROUNDING_PER_STEP = 1e-3\n",
        slice=("tests/verify/test_verify.py::test_a_planted_defect_is_named_by_its_check_step_"
               "and_variable[mean_never_reset_and_loss_over_the_replica_batch]",)),
    Mutation(
        name="digests_miss_a_variable",
        plants="the digests leave out the first variable a checkpoint holds: verify names "
               "another one as the first to part",
        file="trainer/loop/digests.py",
        old="  return {key: of_array(np.asarray(variable.numpy())) for key, variable in keyed.items()}\n",
        new="  return {key: of_array(np.asarray(variable.numpy())) for key, variable in "
            "list(keyed.items())[1:]}\n",
        slice=("tests/verify/test_verify.py::test_a_planted_defect_is_named_by_its_check_step_"
               "and_variable[python_counter]",)),
    Mutation(
        name="inspect_counts_the_step_itself",
        plants="inspect counts the examples of step N itself before global batch N (off by "
               "one step)",
        file="trainer/inspect/batches.py",
        old="  for trained in range(anchor + 1, step):\n",
        new="  for trained in range(anchor + 1, step + 1):\n",
        slice=("tests/verify/test_inspect.py::test_inspect_names_the_rows_each_step_read[1]",)),
    # -- the store and a loop per mode (issue 58) ------------------------------------------
    Mutation(
        name="bucket_predictions_not_fetched",
        plants="a bucket's predictions folder is not fetched before it is read: another "
               "source's predictions there are overwritten, a rerun scores every row again",
        file="trainer/store/files.py",
        old="    bucket.pull_tree(local)\n",
        new="    pass\n",
        slice=("tests/buckets/test_bucket_predict.py::test_predictions_in_a_bucket_are_the_"
               "bytes_of_a_local_run[gs]",)),
    Mutation(
        name="bucket_records_shard_not_put",
        plants="a predictions chunk's records shard is written in the staging folder and "
               "never put in the bucket",
        file="trainer/state/predictions.py",
        old="      files.published(os.path.join(self.directory, RECORDS, records[\"file\"]))\n",
        new="",
        slice=("tests/buckets/test_bucket_predict.py::test_predictions_in_a_bucket_are_the_"
               "bytes_of_a_local_run[s3]",)),
    Mutation(
        name="eval_modes_trace_the_train_step",
        plants="--mode=eval, predict, export and continuous_eval trace the train step and "
               "compile the train loop, as training does",
        file="trainer/loop/assembly.py",
        old="                                       fuse_whole_step, training=not read_only)\n",
        new="                                       fuse_whole_step, training=True)\n",
        also=(Edit("trainer/loop/assembly.py",
               "  if read_only:  # eval, continuous_eval, predict, export: no train step traced or compiled\n",
               "  if False:\n"),),
        slice=("tests/loop/test_mode_builds_what_it_uses.py::test_a_mode_that_does_not_train_"
               "builds_nothing_of_training[eval]",)),
    Mutation(
        name="event_files_written_around_the_store",
        plants="TensorBoard's writer is opened on a folder the store never handed out: "
               "event files appear under model_dir that nothing recorded",
        file="trainer/reporters/summaries.py",
        old="            files.library_folder(os.path.join(self.root, split), \"TensorBoard\"),\n",
        new="            os.path.join(self.root, split),\n",
        slice=("tests/state/test_record_of_writes.py::test_every_file_of_a_local_model_dir_"
               "was_written_by_the_store",)),
    # -- what a run reports: each step once in every tracker (issue 59) ------------------
    Mutation(
        name="tracker_handed_a_step_twice",
        plants="a tracker that cannot delete (MLflow, W&B, a user's) is handed again the "
               "steps a rollback or a resume trains again",
        file="trainer/reporters/fan_out.py",
        old="    if step <= held.get(split, -1):\n      return False  # the tracker has",
        new="    if False:\n      return False  # the tracker has",
        slice=("tests/outputs/test_trackers.py::test_mlflow_history_holds_each_step_once",)),
    # -- sweeps: a trial run again resumes, and is judged on its whole history -----------
    Mutation(
        name="optuna_retry_starts_over",
        plants="a retried Optuna trial (its process died) trains in a model_dir of its own "
               "number: it starts again from step 0",
        file="trainer/sweeps/optuna_trials.py",
        old='number = _frozen(trial).system_attrs.get("failed_trial", trial.number)',
        new="number = trial.number",
        slice=("tests/sweeps/test_optuna.py::test_a_study_killed_mid_trial_and_rerun_ends_as_"
               "the_unkilled_one",)),
    Mutation(
        name="optuna_retry_not_caught_up",
        plants="a retried Optuna trial does not report the evals the dead process reached: "
               "the pruner judges it on half its history",
        file="trainer/sweeps/optuna_trials.py",
        old="    self.report_logged(boundary.model_dir, upto=boundary.step)",
        new="    pass",
        slice=("tests/sweeps/test_optuna.py::test_a_study_killed_mid_trial_and_rerun_ends_as_"
               "the_unkilled_one",)),
    Mutation(
        name="pruned_trial_not_said",
        plants="a trial stopped by its pruner is recorded as stopped by an action, without "
               "who pruned it or where",
        file="trainer/loop/boundary.py",
        old="            reasons.setdefault(action.name, decision.reason)",
        new="            pass",
        slice=("tests/sweeps/test_optuna.py::test_a_study_prunes_and_each_pruned_trial_says_"
               "who_pruned_it",)),
    Mutation(
        name="tracker_not_caught_up",
        plants="what a tracker lost to a SIGKILL (W&B's log is written every 15 s) is not sent "
               "again from metrics.csv: those steps are missing from it",
        file="trainer/reporters/fan_out.py",
        old="      if self._history is not None and self._lacks(label, step):",
        new="      if False:",
        slice=("tests/outputs/test_trackers.py::test_wandb_holds_each_step_once_in_one_run",)),
    Mutation(
        name="tracker_failure_stops_training",
        plants="a tracker's exception mid-run ends the run instead of one warning",
        file="trainer/reporters/fan_out.py",
        old="    except Exception as error:  # pylint: disable=broad-except  (a tracker never stops training)\n",
        new="    except ZeroDivisionError as error:\n",
        slice=("tests/outputs/test_trackers.py::test_a_tracker_that_fails_mid_run_costs_one_warning",)),
    Mutation(
        name="profile_without_step_markers",
        plants="the profile window's steps are traced without step markers: TensorBoard's "
               "overview and step-time pages say \"No step marker observed\"",
        file="trainer/loop/profiling.py",
        old='    return tf.profiler.experimental.Trace("train", step_num=step_num, _r=1)\n',
        new="    return contextlib.nullcontext()\n",
        slice=("tests/outputs/test_tensorboard.py::test_profile_window_writes_a_trace",)),
    # -- the learning rate factor: train.lr_on_plateau, an Action's (issue 60) ------------
    Mutation(
        name="learning_rate_factor_not_restored",
        plants="a restore reads the learning rate factor into action_state but never assigns "
               "it to the variable the step reads: a resumed run trains at factor 1",
        file="trainer/state/train_state.py",
        old="    if self._on_restore is not None:\n      self._on_restore(self.action_state)\n",
        new="",
        slice=("tests/loop/test_lr_on_plateau.py::test_an_action_sets_the_factor_and_a_resume_"
               "keeps_it",)),
]
