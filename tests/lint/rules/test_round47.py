"""Round 47: TensorBoard's ``writer.add_scalar(tag, value, step)`` reads a tensor ``value`` to
the host (TransUNet's trainer logging the loss tensors every batch)."""

from __future__ import annotations

from .helpers import lines

# ---- TPL201: a device tensor handed to `add_scalar` in the batch loop

TRAINER = """\
import torch


def trainer(model, loader, writer, optimizer, ce_loss):
    iter_num = 0
    for i_batch, sampled_batch in enumerate(loader):
        image_batch, label_batch = sampled_batch["image"].cuda(), sampled_batch["label"].cuda()
        outputs = model(image_batch)
        loss = ce_loss(outputs, label_batch.long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        lr_ = 0.01 * (1.0 - iter_num / 1000) ** 0.9
        iter_num = iter_num + 1
        {log}
"""


def test_tensor_handed_to_add_scalar_every_batch_is_found() -> None:
    # SummaryWriter converts a tensor value with `.item()`: a wait on every step
    source = TRAINER.format(log='writer.add_scalar("info/total_loss", loss, iter_num)')
    assert lines(source, "TPL201") == [15]


def test_tensor_handed_by_keyword_to_add_scalar_is_found() -> None:
    source = TRAINER.format(
        log='writer.add_scalar("loss", scalar_value=loss, global_step=iter_num)'
    )
    assert lines(source, "TPL201") == [15]


def test_host_number_handed_to_add_scalar_is_clean() -> None:
    # the learning rate is a Python float, and `loss.item()` is read (and reported) once
    source = TRAINER.format(log='writer.add_scalar("info/lr", lr_, iter_num)')
    assert lines(source, "TPL201") == []


def test_tensor_handed_to_add_scalar_under_a_periodic_test_is_clean() -> None:
    # SimCLR's `if n_iter % log_every_n_steps == 0: writer.add_scalar("loss", loss, ...)`
    source = TRAINER.format(
        log='if iter_num % 100 == 0:\n            writer.add_scalar("loss", loss, iter_num)'
    )
    assert lines(source, "TPL201") == []


def test_add_scalar_after_the_batch_loop_is_clean() -> None:
    source = TRAINER.format(log="pass") + '    writer.add_scalar("last_loss", loss, iter_num)\n'
    assert lines(source, "TPL201") == []
