"""image_folder: class folders of png/jpg files, listed up front, decoded on demand."""
import os
import shutil
import threading

import numpy as np
import PIL.Image
import pytest

from configs import image_folder as image_folder_config
from input_pipelines import sources
from input_pipelines.datasets import image_folder
from input_pipelines.errors import DataError
from tests.support import cli

CLASSES = ("diagonal", "horizontal", "vertical")  # sorted: label ids 0, 1, 2
PER_CLASS = 60
SIZES = ((20, 24), (40, 36), (33, 27))  # (width, height): none is square


def _stripes(kind: str, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
  """float [h, w] in 0..255: stripes of one orientation, random phase, plus noise."""
  ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
  coordinate = {"horizontal": ys / height, "vertical": xs / width,
                "diagonal": (xs / width + ys / height) / 2}[kind]
  wave = np.sin(2 * np.pi * (4 * coordinate + rng.uniform()))
  return np.clip(128 + 90 * wave + rng.normal(0, 40, (height, width)), 0, 255)


def _write_image(path: str, kind: str, k: int, rng: np.random.Generator) -> None:
  width, height = SIZES[k % len(SIZES)]
  pixels = _stripes(kind, width, height, rng)
  if k % 3 == 2:  # a third of the files are grayscale
    image = PIL.Image.fromarray(pixels.astype(np.uint8), mode="L")
  else:  # RGB: the stripes in a random colour
    colour = rng.uniform(0.3, 1.0, size=3)
    image = PIL.Image.fromarray((pixels[..., None] * colour).astype(np.uint8), mode="RGB")
  image.save(path)


def make_folder(root, split: str = "train", classes=CLASSES, per_class: int = PER_CLASS,
                seed: int = 0) -> str:
  """root/split/<class>/<n>.png (every 10th a .jpg, some with upper-case extensions)."""
  rng = np.random.default_rng(seed)
  for kind in classes:
    folder = os.path.join(root, split, kind)
    os.makedirs(folder, exist_ok=True)
    for k in range(per_class):
      extension = (".jpg", ".JPEG", ".PNG")[k // 10 % 3] if k % 10 == 9 else ".png"
      _write_image(os.path.join(folder, f"{k:03d}{extension}"), kind, k, rng)
  return str(root)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """Train only (the eval split is held out); never modified by a test."""
  root = make_folder(tmp_path_factory.mktemp("images"))
  junk = os.path.join(root, "train", CLASSES[0])
  for name in ("notes.txt", ".DS_Store", "._000.png"):  # ignored, not errors
    with open(os.path.join(junk, name), "wb") as f:
      f.write(b"not an image")
  os.makedirs(os.path.join(root, "train", ".cache"))  # a hidden folder is not a class
  with open(os.path.join(root, "train", "LICENSE"), "w") as f:
    f.write("a stray file beside the class folders")
  return root


def _config(directory, **fields):
  config = image_folder_config.get_config().data
  config.unlock()
  config.dir = str(directory)
  for key, value in fields.items():
    setattr(config, key, value)
  return config


def test_classes_and_labels_from_sorted_folders(folder):
  train, evaluation = image_folder.build(_config(folder), seed=0)
  assert train.classes == list(CLASSES) and evaluation.classes == list(CLASSES)
  assert len(train) + len(evaluation) == len(CLASSES) * PER_CLASS  # junk files ignored
  for source in (train, evaluation):
    assert source.labels.dtype == np.int64
    assert source.feature_name == "images"
    for path, label in zip(source.paths, source.labels):
      assert os.path.basename(os.path.dirname(path)) == CLASSES[label]
  assert sum(p.lower().endswith((".jpg", ".jpeg")) for p in train.paths + evaluation.paths) > 0


def test_held_out_share_is_seeded_stratified_and_disjoint(folder):
  config = _config(folder)
  train_a, eval_a = image_folder.build(config, seed=3)
  train_b, eval_b = image_folder.build(config, seed=3)
  _, eval_c = image_folder.build(config, seed=4)
  assert eval_a.paths == eval_b.paths and train_a.paths == train_b.paths
  assert eval_a.paths != eval_c.paths
  assert not set(train_a.paths) & set(eval_a.paths)
  assert len(eval_a) == round(config.eval_fraction * PER_CLASS) * len(CLASSES)
  np.testing.assert_array_equal(np.bincount(eval_a.labels), [12, 12, 12])
  _, half = image_folder.build(_config(folder, eval_fraction=0.5), seed=3)
  assert len(half) == PER_CLASS // 2 * len(CLASSES)


def test_batches_are_resized_float_in_unit_range(folder):
  train, _ = image_folder.build(_config(folder, image_size=16), seed=0)
  indices = np.array([0, 1, 2, len(train) - 1], dtype=np.int64)  # RGB, RGB, grayscale, ...
  images, labels = train[indices]
  assert images.shape == (4, 16, 16, 3) and images.dtype == np.float32
  assert 0.0 <= images.min() and images.max() <= 1.0 and images.std() > 0.05
  np.testing.assert_array_equal(labels, train.labels[indices])
  gray = images[2]  # a grayscale file read as RGB: three equal channels
  np.testing.assert_array_equal(gray[..., 0], gray[..., 1])
  np.testing.assert_array_equal(gray[..., 0], gray[..., 2])


def test_channels_1_reads_grayscale(folder):
  train, evaluation = image_folder.build(_config(folder, channels=1, image_size=8), seed=0)
  images, _ = evaluation[np.arange(len(evaluation), dtype=np.int64)]
  assert images.shape == (len(evaluation), 8, 8, 1) and images.dtype == np.float32
  assert 0.0 <= images.min() and images.max() <= 1.0


def test_exact_values_of_solid_colours(tmp_path):
  folder = tmp_path / "train" / "a"
  folder.mkdir(parents=True)
  PIL.Image.new("RGB", (7, 5), (255, 0, 51)).save(folder / "red.png")
  PIL.Image.new("L", (3, 9), 255).save(folder / "white.png")
  train, evaluation = image_folder.build(_config(tmp_path, image_size=4, eval_fraction=0.5),
                                         seed=0)
  source = train if train.paths[0].endswith("red.png") else evaluation
  images, labels = source[np.array([0], dtype=np.int64)]
  np.testing.assert_allclose(images[0], np.broadcast_to([1.0, 0.0, 0.2], (4, 4, 3)), atol=1e-6)
  assert labels.tolist() == [0]


def test_sixteen_bit_grayscale_keeps_its_range(tmp_path):
  folder = tmp_path / "train" / "a"
  folder.mkdir(parents=True)
  for name, value in (("dark.png", 1000), ("bright.png", 60000)):
    PIL.Image.fromarray(np.full((6, 6), value, dtype=np.uint16)).save(folder / name)
  config = _config(tmp_path, image_size=6, eval_fraction=0.5)
  for channels in (1, 3):
    train, evaluation = image_folder.build(_setfield(config, "channels", channels), seed=0)
    both = {os.path.basename(s.paths[0]): s[np.array([0], dtype=np.int64)][0]
            for s in (train, evaluation)}
    assert both["dark.png"].shape == (1, 6, 6, channels)
    np.testing.assert_allclose(both["dark.png"], 1000 / 65535, rtol=1e-5)
    np.testing.assert_allclose(both["bright.png"], 60000 / 65535, rtol=1e-5)


def _setfield(config, key, value):
  config = config.copy_and_resolve_references()
  setattr(config, key, value)
  return config


def test_decoding_is_lazy(folder, monkeypatch):
  opened = []
  real_open = PIL.Image.open

  def counting_open(path, *args, **kwargs):
    opened.append(str(path))
    return real_open(path, *args, **kwargs)

  monkeypatch.setattr(PIL.Image, "open", counting_open)
  train, _ = image_folder.build(_config(folder), seed=0)
  assert not opened  # listing opens nothing
  train[np.array([5, 40], dtype=np.int64)]
  assert opened == [train.paths[5], train.paths[40]]


def test_reads_from_many_threads_agree_with_one(folder):
  train, _ = image_folder.build(_config(folder, image_size=12), seed=0)
  batches = [np.arange(k, len(train), 7, dtype=np.int64) for k in range(7)]
  expected = [train[b][0] for b in batches]
  results = [None] * len(batches)

  def read(k):
    results[k] = train[batches[k]][0]

  threads = [threading.Thread(target=read, args=(k,)) for k in range(len(batches))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  for got, want in zip(results, expected):
    np.testing.assert_array_equal(got, want)


def test_distloop_reads_it_as_an_indexed_source(folder):
  train, evaluation = image_folder.build(_config(folder), seed=0)
  wrapped_train, wrapped_eval = sources.as_splits((train, evaluation), "data.name='image_folder'")
  assert isinstance(wrapped_train, sources.IndexedSource)
  assert wrapped_train.feature_name == wrapped_eval.feature_name == "images"
  assert wrapped_train.example_spec["labels"] == ((), np.dtype(np.int64))
  features, _ = wrapped_eval.read(np.array([0, 3], dtype=np.int64))
  assert features.shape == (2, 32, 32, 3)


def test_test_folder_is_the_eval_split_with_train_label_ids(tmp_path):
  make_folder(tmp_path, "train", per_class=4)
  make_folder(tmp_path, "test", classes=CLASSES[1:], per_class=3, seed=1)
  train, evaluation = image_folder.build(_config(tmp_path), seed=0)
  assert len(train) == 12 and len(evaluation) == 6
  assert evaluation.classes == list(CLASSES)
  assert evaluation.labels.tolist() == [1, 1, 1, 2, 2, 2]
  assert all(os.sep + "test" + os.sep in p for p in evaluation.paths)
  assert image_folder.build(_config(tmp_path), seed=9)[1].paths == evaluation.paths


def test_test_class_unknown_to_train_is_named(tmp_path):
  make_folder(tmp_path, "train", classes=CLASSES[:2], per_class=2)
  make_folder(tmp_path, "test", classes=CLASSES, per_class=1)
  with pytest.raises(DataError, match=r"test/vertical: class 'vertical' is not a class of train"):
    image_folder.build(_config(tmp_path), seed=0)


def test_corrupt_file_is_named_when_read(tmp_path):
  make_folder(tmp_path, "train", per_class=3)
  bad = tmp_path / "train" / "horizontal" / "001.png"
  bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
  train, evaluation = image_folder.build(_config(tmp_path, eval_fraction=0.34), seed=0)
  source = train if str(bad) in train.paths else evaluation
  index = source.paths.index(str(bad))
  neighbour = 1 if index == 0 else index - 1
  source[np.array([neighbour], dtype=np.int64)]  # the others read fine
  with pytest.raises(DataError, match=f"^{bad}: cannot be decoded"):
    source[np.array([neighbour, index], dtype=np.int64)]


def test_truncated_jpeg_is_named(tmp_path):
  make_folder(tmp_path, "train", classes=CLASSES[:1], per_class=10)
  jpeg = tmp_path / "train" / CLASSES[0] / "009.jpg"
  jpeg.write_bytes(jpeg.read_bytes()[:200])
  train, evaluation = image_folder.build(_config(tmp_path, eval_fraction=0.1), seed=0)
  everything = train.paths + evaluation.paths
  assert str(jpeg) in everything
  source = train if str(jpeg) in train.paths else evaluation
  with pytest.raises(DataError, match=f"^{jpeg}: "):
    source[np.arange(len(source), dtype=np.int64)]


@pytest.mark.parametrize("layout, message", [
    ({}, r"/train: no such folder"),
    ({"train/": None}, r"/train: no class subfolders"),
    ({"train/a/x.png": True, "train/b/readme.txt": False}, r"/train/b: no images"),
    ({"train/a/x.png": True, "test/a/": None}, r"/test/a: no images"),
    ({"train/a/x.png": True, "test/": None}, r"/test: no class subfolders"),
    ({"train/a/x.png": True, "test": False}, r"/test: not a folder"),
])
def test_bad_layouts_are_named(tmp_path, layout, message):
  for relative, is_image in layout.items():
    path = tmp_path / relative
    if relative.endswith("/"):
      path.mkdir(parents=True)
      continue
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_image:
      PIL.Image.new("RGB", (4, 4)).save(path)
    else:
      path.write_text("not an image")
  with pytest.raises(DataError, match=message):
    image_folder.build(_config(tmp_path), seed=0)


def test_missing_or_empty_data_dir(tmp_path):
  with pytest.raises(DataError, match=r"^data\.dir: empty"):
    image_folder.build(_config(""), seed=0)
  with pytest.raises(DataError, match=r"/nowhere: no such folder \(data\.dir\)"):
    image_folder.build(_config(tmp_path / "nowhere"), seed=0)


def test_too_few_images_to_hold_any_out(tmp_path):
  make_folder(tmp_path, "train", per_class=1)
  with pytest.raises(DataError, match=r"/train: data.eval_fraction=0.2 of 3 images holds out none"):
    image_folder.build(_config(tmp_path), seed=0)


@pytest.mark.parametrize("field, value", [
    ("image_size", 0), ("image_size", -3), ("channels", 2), ("channels", 4),
    ("eval_fraction", 0.0), ("eval_fraction", 1.0),
])
def test_bad_fields_are_named(folder, field, value):
  with pytest.raises(DataError, match=rf"^data\.{field}={value!r}: "):
    image_folder.build(_config(folder, **{field: value}), seed=0)


@pytest.mark.slow  # a whole training run or two: the fast suite's time (CI runs it)
def test_trains_well_above_chance_and_exports(folder, tmp_path):
  """3 classes (chance 1/3), 144 train / 36 held-out images of mixed sizes and modes."""
  model_dir = tmp_path / "run"
  summary = cli.train_ok(model_dir, "--config=image_folder", f"--config.data.dir={folder}",
                         "--config.model.num_classes=3", "--config.train.steps=150",
                         "--config.train.steps_per_loop=50", "--config.checkpoint.interval=150")
  assert summary["step"] == 150
  assert summary["eval_examples"] == 36
  assert summary["eval_accuracy"] >= 0.8, summary
  assert os.path.isdir(model_dir / "export" / "150")


def test_file_corrupted_after_listing_is_named_by_the_trainer(folder, tmp_path):
  """The builder lists, the trainer reads: a bad file found mid-run names itself."""
  root = tmp_path / "images"
  shutil.copytree(folder, root)
  bad = root / "train" / "vertical" / "017.png"
  bad.write_bytes(b"not a png at all")
  result = cli.run_trainer(tmp_path / "run", "--config=image_folder", f"--config.data.dir={root}",
                           "--config.model.num_classes=3", "--config.train.steps=20",
                           "--config.train.steps_per_loop=10", timeout=180)
  assert result.returncode == 2, result.stderr[-3000:]
  assert f"{bad}: cannot be decoded as an image" in result.error_lines()[-1]


def test_fewer_model_classes_than_class_folders_is_refused(folder, tmp_path):
  result = cli.run_trainer(tmp_path / "run", "--config=image_folder", f"--config.data.dir={folder}",
                           "--config.model.num_classes=2", "--config.train.steps=10",
                           timeout=180)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "model.num_classes" in result.error_lines()[-1]
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_more_model_classes_than_class_folders_is_refused_naming_both(folder, tmp_path):
  result = cli.run_trainer(tmp_path / "run", "--config=image_folder", f"--config.data.dir={folder}",
                           "--config.model.num_classes=4", "--config.train.steps=10",
                           timeout=180)
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(result.error_lines()) == 1
  assert "has 3 classes" in result.stderr and "set model.num_classes=3?" in result.stderr
  assert not (tmp_path / "run").exists()
