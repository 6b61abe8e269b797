"""A lab build seen as the package's native folder, so the package's own Server starts that build's llama-server."""

from __future__ import annotations

import json
import os


def native_view(work: str, label: str) -> str:
    """A folder the package's Server takes for its native build (PYLLM_NATIVE_DIR): WORK/LABEL-bin's programs and
    libraries (links), a build_info.json saying CUDA, and the chat templates of the current native folder (synth and
    the chat templates need them). Returns the folder, WORK/native-LABEL."""
    view, src = os.path.join(work, f"native-{label}"), os.path.join(work, f"{label}-bin")
    os.makedirs(view, exist_ok=True)
    for f in os.listdir(src):
        if f != "build_info.json" and not os.path.lexists(os.path.join(view, f)):
            os.symlink(os.path.join(src, f), os.path.join(view, f))
    info = os.path.join(view, "build_info.json")
    if os.path.islink(info):  # never write through a link into the build it points at (an installed package's)
        os.unlink(info)
    with open(info, "w") as f:
        json.dump({"cuda": True, "source": f"lab build {label} ({src})", "llama_cpp_commit": "0c1e57098",
                   "cuda_architectures": ["80"]}, f)
    templates = os.path.join(os.environ.get("PYLLM_NATIVE_DIR") or "/tmp/fakenative", "templates")
    if os.path.isdir(templates) and not os.path.lexists(os.path.join(view, "templates")):
        os.symlink(os.path.abspath(templates), os.path.join(view, "templates"))
    return view


def use_installed_build() -> None:
    """A lab program run as ``python -m lab.…`` from the repository root imports the checkout's pyllm_a100 (the current
    folder comes first), which has no llama.cpp build: give it the installed package's (PYLLM_NATIVE_DIR) unless one is
    set. Where the package was imported from its installed place, nothing changes."""
    from pyllm_a100.llamacpp.native import NATIVE_DIR_ENV, shadowed_install

    installed = None if os.environ.get(NATIVE_DIR_ENV) else shadowed_install()
    if installed is not None:
        os.environ[NATIVE_DIR_ENV] = str(installed)
