"""Writing a preset to GGUF files: metadata, vocabulary, chat template, tensors streamed in bounded
chunks, shards, all-or-nothing on disk."""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .chat import chat_template_name
from .vocab import PRE_TOKENIZER, build_vocab
from .plan import SynthError
from .presets import plan, preset
from .tensors import WEIGHT_TYPES, _file_type, draw, tensor_nbytes, typed_tensors

# --- writing ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SynthResult:
    paths: tuple[Path, ...]
    preset: str
    weight_type: str
    layers: int
    n_tensors: int
    bytes_written: int
    seconds: float
    peak_rss: int  # bytes, this process's peak so far

    @property
    def first(self) -> Path:
        return self.paths[0]

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 2**20 / max(self.seconds, 1e-9)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int | None) -> int:
    """``"2G"``, ``"500M"``, ``"64KiB"`` or a number of bytes -> bytes (0: no limit)."""
    if text is None or text == "":
        return 0
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if match is None or float(match[1]) <= 0:
        raise SynthError(f"--split-max-size {text}: not a positive size; use e.g. 500M, 2G or a number of bytes")
    return int(float(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " "))


def _chat_template(family: str) -> str | None:
    from ..llamacpp.native import native_dir

    path = native_dir() / "templates" / chat_template_name(family)
    return path.read_text() if path.is_file() else None


def _add_kv(writer, key: str, value: Any, kind: str) -> None:
    from gguf import GGUFValueType as V

    scalar = {"u32": V.UINT32, "f32": V.FLOAT32, "bool": V.BOOL, "str": V.STRING, "i32": V.INT32}
    if kind in scalar:
        writer.add_key_value(key, value, scalar[kind])
    else:
        sub = {"u32[]": V.UINT32, "f32[]": V.FLOAT32, "i32[]": V.INT32, "str[]": V.STRING}[kind]
        writer.add_key_value(key, list(value), V.ARRAY, sub_type=sub)


def _stream_tensor(writer, chunks: Iterator[bytes], nbytes: int) -> None:
    """``GGUFWriter.write_tensor_data`` for one tensor, fed in chunks instead of one array.

    Same bookkeeping as the library method (pop the next tensor info of the current
    shard, align, write, pad), without holding the tensor in memory.
    """
    from gguf.gguf_writer import WriterState

    file_id = next(i for i, tensors in enumerate(writer.tensors) if tensors)
    fout = writer.fout[file_id]
    name = next(iter(writer.tensors[file_id]))
    info = writer.tensors[file_id].pop(name)
    assert info.nbytes == nbytes, (name, info.nbytes, nbytes)
    writer.write_padding(fout, fout.tell())
    written = 0
    for chunk in chunks:
        fout.write(chunk)
        written += len(chunk)
    if written != nbytes:
        raise SynthError(f"internal: {name} wrote {written} bytes, planned {nbytes}")
    writer.write_padding(fout, nbytes)
    writer.state = WriterState.WEIGHTS


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _write_error(exc: OSError, output: Path) -> SynthError:
    """An OSError while writing the model, as one line that says what to do (nothing is left behind)."""
    import errno

    folder = output.parent
    if exc.errno == errno.ENOSPC:
        return SynthError(f"the disk under {folder} filled up while writing {output.name} (nothing was left behind): free space, "
                          "pick another folder, or cut depth with --layers")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return SynthError(f"cannot write to {folder} ({exc.strerror}): choose an -o in a writable folder")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return SynthError(f"cannot create {folder}: a part of the path is a file, not a folder ({exc.filename})")
    return SynthError(f"writing {output} failed ({exc.strerror or exc}): nothing was left behind; check the folder and try again")


def synthesize(
    preset_name: str,
    output: str | os.PathLike[str],
    *,
    layers: int | None = None,
    experts: int | None = None,
    weight_type: str | None = None,
    split_max_size: str | int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> SynthResult:
    """Write a synthetic model; returns the files (shard 1 first) and throughput.

    ``experts`` replaces the routed expert count (MoE presets; see ``hparams_for``).
    ``output`` is the file name (``model.gguf``); with ``split_max_size`` the files are
    ``model-00001-of-0000N.gguf``... Everything is written in a temporary folder beside
    the output and moved into place at the end: no half-written model is ever visible.
    """
    import gguf

    p = preset(preset_name)
    wtype = weight_type or p.default_type
    if wtype not in WEIGHT_TYPES:
        raise SynthError(f"unknown weight type {wtype!r}: choose one of {', '.join(WEIGHT_TYPES)}")
    output = Path(output)
    if output.suffix != ".gguf":
        raise SynthError(f"{output}: the output name must end in .gguf")
    if output.is_dir():
        raise SynthError(f"{output} is a folder: give a file name ending in .gguf")
    max_size = parse_size(split_max_size)
    the_plan = plan(preset_name, layers, experts)
    n_vocab = p.hparams["n_vocab"]
    vocab = build_vocab(n_vocab)
    typed = typed_tensors(the_plan, wtype)
    the_plan = dataclasses.replace(the_plan, tensors=[t for t, _ in typed])
    types = {t.name: ggml_type for t, ggml_type in typed}
    sizes = {t.name: tensor_nbytes(t, types[t.name]) for t in the_plan.tensors}
    total = sum(sizes.values())

    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(output.parent).free
        needed = int(total * 1.01) + (64 << 20)  # the tensors, plus the header and a margin
        if free < needed:
            raise SynthError(
                f"{output.parent} has {_size(free)} free but writing the model needs {_size(needed)} "
                f"({_size(total)} of tensors plus a 1 % + 64 MiB margin): free space, pick another folder, or cut depth with --layers"
            )
        work = Path(tempfile.mkdtemp(prefix=f".{output.stem}.synth-", dir=output.parent))
    except OSError as exc:
        raise _write_error(exc, output) from exc
    final: list[Path] = []
    started = time.monotonic()
    try:
        writer = gguf.GGUFWriter(work / output.name, the_plan.arch, split_max_size=max_size)
        writer.add_name(f"pyllm-synth {p.name}")
        writer.add_file_type(int(_file_type(wtype)))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_key_value("pyllm.synthetic", True, gguf.GGUFValueType.BOOL)
        writer.add_key_value("pyllm.preset", p.name, gguf.GGUFValueType.STRING)
        writer.add_key_value("pyllm.weight_type", wtype, gguf.GGUFValueType.STRING)
        writer.add_key_value("pyllm.seed", int(seed), gguf.GGUFValueType.UINT32)
        for key, value, kind in the_plan.kv:
            _add_kv(writer, key, value, kind)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(PRE_TOKENIZER)
        writer.add_token_list(list(vocab.tokens))
        writer.add_token_types(list(vocab.types))
        writer.add_token_merges(list(vocab.merges))
        writer.add_bos_token_id(vocab.bos_id)
        writer.add_eos_token_id(vocab.eos_id)
        writer.add_pad_token_id(vocab.pad_id)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        template = _chat_template(p.family)
        if template:
            writer.add_chat_template(template)
        for t in the_plan.tensors:
            # numpy order is ggml's reversed; the dtype argument only matters for raw_dtype=None
            writer.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), sizes[t.name], raw_dtype=types[t.name])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        done = 0
        for t in the_plan.tensors:
            _stream_tensor(writer, draw(t, types[t.name], seed, the_plan.arch, from_values=wtype == "nvfp4-mix"), sizes[t.name])
            done += sizes[t.name]
            if progress is not None:
                progress(done, total)
        writer.close()
        written = sorted(work.iterdir())
        for f in written:
            target = output.parent / f.name
            os.replace(f, target)
            final.append(target)
    except OSError as exc:
        for f in final:  # never leave part of a shard set behind
            f.unlink(missing_ok=True)
        raise _write_error(exc, output) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - started
    return SynthResult(
        paths=tuple(final),
        preset=p.name,
        weight_type=wtype,
        layers=the_plan.n_layers,
        n_tensors=len(the_plan.tensors),
        bytes_written=sum(f.stat().st_size for f in final),
        seconds=seconds,
        peak_rss=_peak_rss(),
    )


def _peak_rss() -> int:
    """This process's peak resident memory, bytes: Linux's VmHWM. ru_maxrss is not it: Linux keeps across exec the
    peak of the process image before, i.e. the parent's resident memory at fork (a test runner's, a notebook's)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
