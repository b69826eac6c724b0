"""The store: the one owner of every byte under model_dir, on a local disk or a bucket.

`model_dir.py` names every path of the layout; `files.py` is the one atomic writer
(temporary, fsync, rename, pushed to the bucket when model_dir is one) and the one
lock on a folder; `writer_lock.py` the one-writer lock (flock on disk, the lease on a
bucket: `lease.py`); `mirror.py` stages a bucket model_dir on the local disk and puts
what is finished in the bucket (`object_stores.py`, with `gcs_bucket.py` and
`s3_bucket.py`); `storage.py` says a full or denied disk in one line; `record.py` keeps
the store's own record of what it wrote (DISTLOOP_STORE_RECORD), for the audit that
nothing else writes there.

Nothing outside this folder renames, locks or opens a file under model_dir for
writing (tests/docs/test_layout.py); libraries that write their own files (orbax,
TensorBoard's writer, the profiler) write into a folder the store hands them
(`files.library_folder`) and the store puts what they finished in the bucket; the
SavedModel exporter and the Parquet writer write a temporary the store commits.
"""
