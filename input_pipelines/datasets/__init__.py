"""The built-in datasets: what each built-in `data.name` builds, and the readers they use.

One module per dataset family, each a builder with the plug-in signature
`build(data_config, seed) -> (train, eval)` that input_pipelines/__init__.py's
`BUILTINS` maps names to (the names users type never name these modules):
synthetic, mnist (+ fashion_mnist; idx reads its files, splits is their in-memory
form), table (tabular, regression; csv_rows reads a CSV in chunks), image_folder,
recommender. option_names: how a message names an option, as a config field or as
the converter's flag (input_pipelines/records/ reads these datasets too).
Numpy only until the pipeline runs; nothing here imports input_pipelines/records/.
"""
