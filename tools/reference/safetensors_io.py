"""safetensors files as torch tensors, with numpy only (the reference modules' one reader and writer).

    tensors = read_safetensors(path)                       # BF16 stays torch.bfloat16
    tensors, metadata = read_safetensors(path, with_metadata=True)
    write_safetensors(path, tensors, {"key": "value"})
"""

import json
import struct

import numpy as np
import torch

_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8}
_ST = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.uint8: "U8", torch.int8: "I8"}


def read_safetensors(path, with_metadata=False):
    """All tensors of one file as torch tensors (BF16 stays torch.bfloat16); optionally the metadata too ({} when
    the file has none)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        a = np.frombuffer(data[b:end], dtype=_NP[e["dtype"]]).reshape(e["shape"]).copy()
        out[name] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if e["dtype"] == "BF16" else \
            torch.from_numpy(a)
    return (out, header.get("__metadata__") or {}) if with_metadata else out


def write_safetensors(path, tensors, metadata=None):
    """Tensors sorted by element size (largest first) then name, so every offset is aligned to its dtype."""
    names = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header, blobs, off = {}, [], 0
    for k in names:
        t = tensors[k].detach().cpu().contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[k] = {"dtype": _ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
