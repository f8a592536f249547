"""A trained file as its difference from the file it started as, small enough to carry where the size is limited.

The text encoder trained with the DiT keeps its template's layout and most of its bytes (the embedding rows no
caption uses never move), so the XOR of the two files packs to a fifth of the file with xz. The template is
rebuilt anywhere by h3-tinymodel (deterministic), so the pair (template, delta) stands for the trained file.

    python3 tools/train/delta.py pack BASE NEW DELTA.xz            # DELTA.xz and NEW's sha256
    python3 tools/train/delta.py unpack BASE DELTA.xz OUT [SHA256]  # OUT = BASE xor delta; checked when SHA256 given
"""

import hashlib
import lzma
import sys

import numpy as np


def main(argv):
    if len(argv) >= 4 and argv[0] == "pack":
        base, new = (np.fromfile(p, dtype=np.uint8) for p in argv[1:3])
        if base.size != new.size:
            raise SystemExit(f"delta: {argv[1]} has {base.size} bytes and {argv[2]} {new.size}: no delta of files of "
                             "different sizes")
        with lzma.open(argv[3], "wb", preset=9) as f:
            f.write((base ^ new).tobytes())
        print(f"{argv[3]}: {(base != new).sum()} of {base.size} bytes differ; sha256 {hashlib.sha256(new).hexdigest()}")
        return 0
    if len(argv) in (4, 5) and argv[0] == "unpack":
        base = np.fromfile(argv[1], dtype=np.uint8)
        with lzma.open(argv[2], "rb") as f:
            d = np.frombuffer(f.read(), dtype=np.uint8)
        if base.size != d.size:
            raise SystemExit(f"delta: {argv[1]} has {base.size} bytes, the delta {d.size}: not the file it was made from")
        out = (base ^ d).tobytes()
        if len(argv) == 5 and hashlib.sha256(out).hexdigest() != argv[4]:
            raise SystemExit(f"delta: {argv[3]} would not be the packed file (sha256 differs): another base?")
        with open(argv[3], "wb") as f:
            f.write(out)
        return 0
    raise SystemExit(__doc__.strip().splitlines()[-2].strip() + "\n" + __doc__.strip().splitlines()[-1].strip())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
