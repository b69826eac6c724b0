"""The store: the one owner of every byte under model_dir, on a local disk or a bucket.

`model_dir.py` names every path of the layout; `files.py` is the one atomic writer
(temporary, fsync, rename, pushed to the bucket when model_dir is one) and the one
lock on a folder; `writer_lock.py` the one-writer lock (flock on disk, the lease on a
bucket: `lease.py`); `mirror.py` stages a bucket model_dir on the local disk and puts
what is finished in the bucket (`object_stores.py`, with `gcs_bucket.py` and
`s3_bucket.py`); `storage.py` says a full or denied disk in one line.

Nothing outside this folder renames, locks or opens a file under model_dir for
writing (tests/docs/test_layout.py); libraries that write their own files (orbax,
TensorBoard's writer, the SavedModel exporter) write into the store's staging folder
and the store commits them.
"""
