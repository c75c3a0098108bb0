"""The schedules shipped for the H100 and the H200 on the GPU (skipped without CUDA): every entry's launch
settings compile within the device's shared memory in every specialization the batched kernel
launches (full or masked regions, aligned or not), so no residual tile finds a setting too deep;
the persistent kernel fits them by construction (tests/gpu/test_megakernel_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from tests.schedules.family import SHIPPED, family_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TASKS = {"small": 1, "medium": 32, "large": 1000}  # a batch size in each bucket


@pytest.mark.parametrize("device", sorted(SHIPPED))
def test_every_shipped_entry_fits_every_specialization(tmp_path, device):
    from pto import programs
    from pto.backends.triton import TritonBackend
    from pto.backends.triton.schedules import ScheduleDB

    db = ScheduleDB(device, user_dir=tmp_path, shipped=programs.get("llama7b").schedules)
    be = TritonBackend("cuda", schedules=db)
    kernels = family_kernels(be, SHIPPED[device])
    checked, bad = set(), []
    for f in sorted(db.shipped_dirs[0].glob("*.json")):
        for e in db.entries(f.stem, db.shipped_dirs[0]):
            key = (e.source, tuple(sorted(e.params.items())))
            if key in checked:
                continue
            checked.add(key)
            fn = kernels[(e.variant, e.source)]
            unfit = be.unfit_specializations(fn, TASKS[e.bucket])
            bad += [f"{e.variant} {e.bucket} {e.params}: {why}" for why in unfit]
    assert checked and not bad, bad
