"""What a run reports, each in its own writer: TensorBoard's event files
(`summaries.py`), metrics.csv (`metrics_log.py`) and an MLflow run (`mlflow_log.py`).
The loop hands each a split's values at a step; each writes through the store and,
on a resume, rewinds to the restored step (no row lost or doubled).
"""
