"""How the user spelled each data option, so that a message names what they typed: config
fields when training (`data.dir`), the converter's flags when converting (`--input`)."""

CONFIG = {"dir": "data.dir", "label_column": "data.label_column",
          "eval_fraction": "data.eval_fraction", "image_size": "data.image_size",
          "channels": "data.channels"}
CONVERTER = {"dir": "--input", "label_column": "--label", "eval_fraction": "--eval_fraction",
             "image_size": "--image_size", "channels": "--channels"}
