"""The GGUF header of a file on a hub, read with HTTP Range requests (no download of the weights).

A header holds the metadata, the vocabulary and the tensor table: a few MB even for a 700 GB
model. The first ``RANGE_START`` bytes are fetched through huggingface_hub's own session (its
endpoint, token and proxy settings apply) into a temporary file that ggml's parser reads; a
header longer than that is fetched again with twice the range, up to ``RANGE_MAX``.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from ..errors import FetchError
from .gguf_header import Header, HeaderError, read_header

log = logging.getLogger(__name__)

RANGE_START = 8 << 20
RANGE_MAX = 256 << 20


def _get_range(repo: str, path: str, revision: str, n_bytes: int, token: str | None) -> bytes:
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo, path, revision=revision)
    headers = {**build_hf_headers(token=token), "Range": f"bytes=0-{n_bytes - 1}"}
    response = get_session().get(url, headers=headers, follow_redirects=True)
    if response.status_code not in (200, 206):
        raise FetchError(f"{repo}/{path}: the hub answered HTTP {response.status_code} to a range request for its header; "
                         "check the name and your token, or fetch the shard and run doctor on the file")
    return response.content[:n_bytes]  # a server that ignores Range sends everything: keep the range


def remote_header(repo: str, path: str, *, revision: str = "main", token: str | None = None) -> Header:
    """Shard ``path``'s header, parsed by ggml; FetchError when it is not GGUF or longer than RANGE_MAX."""
    n = RANGE_START
    while True:
        data = _get_range(repo, path, revision, n, token)
        if data[:4] != b"GGUF":
            raise FetchError(f"{repo}/{path} is not a GGUF file (it starts with {data[:4]!r})")
        with tempfile.TemporaryDirectory(prefix="pyllm-header-") as folder:
            local = Path(folder) / "header.gguf"
            local.write_bytes(data)
            try:
                return read_header(local)
            except HeaderError as exc:
                if len(data) < n or n >= RANGE_MAX:  # the whole file, or as much as we read, does not parse
                    raise FetchError(f"{repo}/{path}: its GGUF header does not parse in the first {len(data) >> 20} MiB ({exc})") from exc
                log.info("header of %s/%s is longer than %d MiB; reading more", repo, path, n >> 20)
                n *= 2
