"""What a file's project shows as a whole (:mod:`torchplace.lint.project`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchplace.lint import project
from torchplace.lint.project import pins_anywhere, project_root, runs_models

LOADER = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=8{})\n"


def write(root: Path, files: dict[str, str]) -> Path:
    (root / "setup.cfg").write_text("")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    project._scan.cache_clear()
    project_root.cache_clear()
    return root


def test_a_project_whose_loaders_pin_nothing(tmp_path: Path) -> None:
    root = write(tmp_path, {"train.py": LOADER.format(", pin_memory=False"), "lib/u.py": "x\n"})
    assert pins_anywhere(str(root / "lib" / "u.py")) is False


@pytest.mark.parametrize(
    "text",
    [
        LOADER.format(", pin_memory=True"),
        LOADER.format(", pin_memory=args.pin_mem"),
        LOADER + "x = x.pin_memory()\n",
        LOADER + "buf = torch.empty(8, pin_memory=True)\n",
        LOADER + "assert x.is_pinned()\n",
        LOADER + "kwargs = {'pin_memory': True}\n",
        LOADER + "from transformers import TrainingArguments\n",
    ],
)
def test_any_sign_of_pinning_may_pin(tmp_path: Path, text: str) -> None:
    root = write(tmp_path, {"train.py": text})
    assert pins_anywhere(str(root / "train.py")) is True


def test_a_setting_in_a_configuration_file_may_pin(tmp_path: Path) -> None:
    root = write(tmp_path, {"train.py": LOADER.format(""), "conf/data.yaml": "pin_memory: true\n"})
    assert pins_anywhere(str(root / "train.py")) is True


def test_a_commented_out_pin_does_not_count(tmp_path: Path) -> None:
    root = write(tmp_path, {"train.py": LOADER.format("") + "# x = x.pin_memory()\n"})
    assert pins_anywhere(str(root / "train.py")) is False


def test_no_loader_in_sight_gives_no_answer(tmp_path: Path) -> None:
    root = write(tmp_path, {"utils.py": "def to_gpu(x):\n    return x.cuda(non_blocking=True)\n"})
    assert pins_anywhere(str(root / "utils.py")) is None


def test_a_loader_in_another_top_level_folder_is_not_the_files(tmp_path: Path) -> None:
    root = write(tmp_path, {"scripts/eval.py": LOADER.format(""), "src/pkg/train.py": "x\n"})
    assert pins_anywhere(str(root / "src" / "pkg" / "train.py")) is None
    assert pins_anywhere(str(root / "scripts" / "eval.py")) is False


def test_no_project_and_sources_not_on_disk_give_no_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write(tmp_path, {"train.py": LOADER.format("")})
    assert pins_anywhere(str(root / "missing.py")) is None
    monkeypatch.setattr(project, "_MARKERS", ("no-such-marker",))
    project_root.cache_clear()
    assert pins_anywhere(str(root / "train.py")) is None


def test_an_installed_package_is_its_own_project(tmp_path: Path) -> None:
    package = tmp_path / "site-packages" / "lib"
    package.mkdir(parents=True)
    (tmp_path / "setup.cfg").write_text("")
    project_root.cache_clear()
    assert project_root(str(package)) == str(package)


def test_a_project_too_large_to_read_gives_no_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write(tmp_path, {f"m{i}.py": LOADER.format("") for i in range(4)})
    monkeypatch.setattr(project, "_MAX_FILES", 2)
    project._scan.cache_clear()
    assert pins_anywhere(str(root / "m0.py")) is None


def test_a_vendored_project_of_its_own_is_not_read(tmp_path: Path) -> None:
    root = write(
        tmp_path,
        {
            "train.py": LOADER.format(", pin_memory=False"),
            "apex/setup.py": "from setuptools import setup\n",
            "apex/examples/main.py": LOADER.format(", pin_memory=True"),
        },
    )
    assert pins_anywhere(str(root / "train.py")) is False


@pytest.mark.parametrize(
    "text",
    [
        "loss.backward()\n",
        "trainer = pl.Trainer(max_epochs=3)\n",
        "model.fit(x, y)\n",
        "model.eval()\n",
        "with torch.inference_mode():\n    y = model(x)\n",
        "for batch in train_loader:\n    pass\n",
    ],
)
def test_any_code_running_models_is_a_project_that_runs_them(tmp_path: Path, text: str) -> None:
    root = write(tmp_path, {"models.py": "class Net: ...\n", "scripts/run.py": text})
    assert runs_models(str(root / "models.py")) is True


def test_a_library_of_models_alone_runs_none(tmp_path: Path) -> None:
    files = {"models.py": "class Net: ...\n# loss.backward()\n", "README.md": "model.eval()\n"}
    root = write(tmp_path, files)
    assert runs_models(str(root / "models.py")) is False
    assert runs_models(str(root / "missing.py")) is None
