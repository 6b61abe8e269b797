"""The synthetic models of the serving runs (gpu_cotenancy, gpu_multidevice) by name, and the results file they share.

Models: WORK/NAME.gguf, written once by ``pyllm_a100.synth`` with seed 42 (a NAME.gguf.done marker says it is
complete, so a warm machine's second call writes nothing); a path ending in .gguf stands for itself (the CPU tests'
tiny files). Results: one JSON file of rows, written atomically after every row, where a row replaces the row of the
same key measured before (a job cut short keeps what it measured; a later job adds to the file).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

# name -> (synth preset, layers (None: the preset's), routed experts kept (None: the preset's), weight type (None: the
# preset's, ud-q8-k-xl for the real shapes)); 16 of 256 experts keeps every layer's per-token work in a smaller file
MODELS: dict[str, tuple[str, int | None, int | None, str | None]] = {
    "v4-43l": ("deepseek-v4-flash", 43, 16, None),  # the full model's depth (lab/notes/gpu-state.md), 17.0 GB
    "glm5-12l": ("glm-5", 12, 16, None),  # GLM-5's 3 dense and 9 MoE layers, 8.2 GB
    # DeepSeek-V3.2: synth has no real-shape preset, so its layout (MLA + DSA indexer, dense then MoE layers) at tiny
    # widths, 16 layers deep so that 8 devices each hold some, in the UD mix (MXFP4 experts): 99 MB
    "v32-16l": ("tiny-deepseek32", 16, None, "ud-q8-k-xl"),
    "v4-4l": ("deepseek-v4-flash", 4, 16, None),
}
SEED = 42


def check(names: Iterable[str]) -> list[str]:
    """The names (or .gguf paths) given, refusing unknown ones in one line."""
    names = [n for n in names if n]
    bad = [n for n in names if n not in MODELS and not n.endswith(".gguf")]
    if bad:
        raise ValueError(f"unknown model {', '.join(bad)}: choose from {', '.join(MODELS)} or give a .gguf path")
    return names


def path(work: str, name: str) -> str:
    return name if name.endswith(".gguf") else os.path.join(work, f"{name}.gguf")


def label(name: str) -> str:
    """The row's model: the name, or a path's file name without .gguf."""
    return os.path.basename(name)[: -len(".gguf")] if name.endswith(".gguf") else name


def layers(model_path: str) -> int:
    """The file's block count, from its header."""
    from pyllm_a100.models.gguf_files import resolve_model

    files = resolve_model(model_path)
    return int(files.metadata.get(f"{files.architecture}.block_count") or 0)


def write(work: str, names: Iterable[str]) -> dict[str, Any]:
    """Write the named models that are missing (paths are left alone); what was written, with seconds and bytes."""
    from pyllm_a100.synth import synthesize

    out: dict[str, Any] = {}
    os.makedirs(work, exist_ok=True)
    for name in check(names):
        target = path(work, name)
        if name.endswith(".gguf") or os.path.exists(target + ".done"):
            out[name] = {"path": target, "kept": True}
            continue
        preset, n_layers, experts, wtype = MODELS[name]
        t0 = time.time()
        synthesize(preset, target, layers=n_layers, experts=experts, weight_type=wtype, seed=SEED)
        seconds = round(time.time() - t0, 1)
        with open(target + ".done", "w") as f:
            f.write(str(seconds))
        out[name] = {"path": target, "seconds": seconds, "bytes": os.path.getsize(target),
                     "recipe": {"preset": preset, "layers": n_layers, "experts": experts, "type": wtype, "seed": SEED}}
        print(f"wrote {target} in {seconds} s", flush=True)
    return out


class Results:
    """Rows of one results file, keyed by ``key`` fields; ``header`` entries are kept at the top level (the command,
    the settings), ``finish`` fills derived fields of every row before each write."""

    def __init__(self, file: str | os.PathLike[str], key: Sequence[str], header: dict[str, Any],
                 finish: Callable[[list[dict]], None] | None = None) -> None:
        import json

        self.file, self.key, self.finish = Path(file), tuple(key), finish
        old = json.loads(self.file.read_text()) if self.file.is_file() else {}
        self.data: dict[str, Any] = {**old, **header}
        self.data.setdefault("rows", [])
        self.data.setdefault("commands", [])
        if header.get("command") and header["command"] not in self.data["commands"]:
            self.data["commands"].append(header["command"])

    @property
    def rows(self) -> list[dict]:
        return self.data["rows"]

    def find(self, **match: Any) -> dict | None:
        return next((r for r in self.rows if all(r.get(k) == v for k, v in match.items())), None)

    def put(self, row: dict) -> None:
        self.data["rows"] = [r for r in self.rows if any(r.get(k) != row.get(k) for k in self.key)] + [row]
        self.save()

    def save(self) -> None:
        from pyllm_a100.home import write_json_atomic

        if self.finish:
            self.finish(self.rows)
        self.data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.file, self.data)


def report(file: str | os.PathLike[str], heading: str, line: Callable[[dict], str | None]) -> dict:
    """Print a results file's rows (``heading``, then ``line(row)`` of each row it gives a line for) and copy the file
    into $OUT when set; its data."""
    import json

    if not os.path.exists(file):
        raise RuntimeError(f"no rows yet ({file})")
    data = json.loads(Path(file).read_text())
    print(heading)
    for row in data["rows"]:
        text = line(row)
        if text is not None:
            print(text)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        from lab.bench.jsonrows import dumps

        Path(out, os.path.basename(file)).write_text(dumps(data))  # as lab/results keeps it
    return data
