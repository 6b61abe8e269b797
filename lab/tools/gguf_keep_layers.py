"""A GGUF cut to its first N blocks (real weights, fewer layers), small enough to travel to the GPU machine in one call.

    python -m lab.tools.gguf_keep_layers IN.gguf OUT.gguf N

Keeps every metadata key (ARCH.block_count set to N) and every tensor but blk.I.* for I >= N, copied by the gguf
package's own gguf_new_metadata.copy_with_new_metadata. For numerical checks that need a real model's weights and activations (the KLD gap on
SmolLM2: lab/notes/gpu-state.md), not for its answers. Writes OUT.tmp, then renames it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("layers", type=int)
    a = ap.parse_args()
    import gguf

    if not os.path.isfile(a.src):
        ap.error(f"{a.src}: no such file")
    reader = gguf.GGUFReader(a.src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    blocks = int(reader.fields[key].contents())
    if not 1 <= a.layers <= blocks:
        ap.error(f"layers {a.layers}: {a.src} has {blocks} blocks; keep 1 to {blocks}")
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    kept = [t for t in reader.tensors if not (m := re.match(r"blk\.(\d+)\.", t.name)) or int(m.group(1)) < a.layers]
    reader.tensors = kept  # copy_with_new_metadata copies reader.tensors: the first N blocks and the rest
    tmp = a.dst + ".tmp"
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {key: MetadataDetails(reader.fields[key].types[0], a.layers)}, [])
    os.replace(tmp, a.dst)
    print(f"{a.dst}: {a.layers} of {blocks} blocks, {len(kept)} tensors, {os.path.getsize(a.dst) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
