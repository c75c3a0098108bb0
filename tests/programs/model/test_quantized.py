"""The quantized weights of the real checkpoint (SmolLM2-135M-Instruct, Q4_1 layers and a Q8_0
embedding): every tensor of the file repacked into rows of planes dequantizes to the ``gguf``
package's values bit for bit."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
def test_every_quantized_tensor_of_the_file_dequantizes_as_gguf_does(smollm, one_thread):
    import gguf

    from pto.quant import from_gguf
    from pto.quant.gguf_blocks import format_of_gguf
    from pto.quant.planes import dequantize_rows

    reader = gguf.GGUFReader(smollm)
    seen = {}
    for t in reader.tensors:
        fmt = format_of_gguf(t.tensor_type.name)
        if fmt is None:
            continue
        rows, cols = (int(n) for n in reversed(t.shape.tolist()))
        data = torch.from_numpy(t.data.copy())  # (the file's map is read-only)
        ref = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).reshape(rows, cols))
        got = dequantize_rows(fmt, from_gguf(fmt, data, cols), cols)
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32)), t.name
        seen[fmt.name] = seen.get(fmt.name, 0) + 1
    assert seen == {"q4_1": 210, "q8_0": 1}
