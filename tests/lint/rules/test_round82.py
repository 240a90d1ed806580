"""Round 82 (TPL201): ``zip(*meshes)`` walks the items of the sequences a value holds, side by
side, not the rows of one tensor: each item copied and written out is the loop's output."""

from __future__ import annotations

from .helpers import lines as _lines

MESHES = """\
import torch


def save_meshes(generator, grid_z, mesh_dir, device):
    generator.to(device)
    with torch.no_grad():
        for idx in range(len(grid_z)):
            generated = generator.generate_3d_mesh(grid_z[idx].to(device))
            for n, (mesh_v, mesh_f) in enumerate(zip(*generated)):
                save_obj(mesh_v.cpu().numpy(), mesh_f.cpu().numpy(), f"{mesh_dir}/{idx}_{n}.obj")
"""


def test_items_of_transposed_sequences_written_out_are_the_output() -> None:
    assert _lines(MESHES, "TPL201") == []


def test_the_same_copies_used_on_the_host_are_reads() -> None:
    used = MESHES.replace(
        'save_obj(mesh_v.cpu().numpy(), mesh_f.cpu().numpy(), f"{mesh_dir}/{idx}_{n}.obj")',
        "print(mesh_v.cpu().numpy().mean() + mesh_f.cpu().numpy().mean())",
    )
    assert _lines(used, "TPL201") == [10, 10]
