"""The error tree. Every message says what is wrong, then what to do.

PyllmError
├── NativeBuildNotFound (FileNotFoundError)   the compiled llama.cpp is missing
├── BindingsError (ImportError)               llama-cpp-python missing or bound elsewhere
├── InvalidArgument (ValueError)              a value out of range: --max-tokens -5, --restart -1, ...
├── TensorSplitError (ValueError)             bad --tensor-split
├── GpuSelectionError (ValueError)            bad --gpus 0-3 (syntax, a GPU not there, none visible)
├── ModelError                                a model that cannot be served as given
│   ├── ModelNotFound (FileNotFoundError)
│   ├── AmbiguousModel (ValueError)           a folder with several models
│   ├── NotFirstShard (ValueError)            shard 2 given instead of shard 1
│   ├── ShardMissing (FileNotFoundError)      a shard of the set is absent
│   ├── NotAGGUF (ValueError)
│   ├── TruncatedModel (ValueError)           cut short or corrupt
│   ├── ModelUnreadable (PermissionError)
│   ├── UnknownArchitecture (ValueError)      the llama.cpp build is older than the model
│   ├── drafts.DraftError (ValueError)        --draft that does not fit the model (vocabulary, architecture, depth)
│   │   └── drafts.InProcessUnsupported       a DSpark/MTP draft (or a deepseek4 model) with in-process Llama(draft=...)
│   └── drafts.DraftNotFound (FileNotFoundError)  --draft auto with no draft beside the model
├── FetchError                                pyllm fetch (also: a package with no GGUF inside)
│   ├── RepoNotFound (FileNotFoundError)       no such repo, package or package version; a malformed name
│   ├── AccessDenied (PermissionError)         gated / private: pass a token
│   ├── HubUnreachable (ConnectionError)       hub or package index: suggest a mirror (HF_ENDPOINT, pip settings) or an offline copy
│   ├── NotEnoughDisk (OSError)
│   └── VerificationFailed (ValueError)        size, sha256 or shard set wrong
├── StateError (OSError)                      PYLLM_HOME unusable (a file, read-only, ...)
└── ServerError (RuntimeError)                a managed llama-server
    ├── ServerConfigError (ValueError)        bad --ctx-size, --split-mode, ...
    ├── PortInUse (OSError)
    ├── ServerDied                            exited; the message explains the log
    ├── ServerStartTimeout (TimeoutError)
    ├── ServerNotFound (LookupError)          pyllm stop/logs NAME with no such server
    ├── ServiceError                          pyllm service: systemd not running, systemctl failed, no such unit
    └── RpcError (ConnectionError)            an rpc-server that does not answer, or an unsafe bind

The CLI prints any PyllmError as one line and exits 1 (traceback with PYLLM_DEBUG=1); `pyllm serve`
exits EX_CONFIG (78) for the configuration errors in CONFIG_ERRORS, so systemd does not restart a unit
that can never start (RestartPreventExitStatus=78).
"""

from __future__ import annotations


class PyllmError(Exception):
    """Base of every error pyllm-a100 raises on purpose."""


class NativeBuildNotFound(PyllmError, FileNotFoundError):
    """``no llama.cpp build found (tried: …): reinstall with pip install -r requirements.txt .``"""


class BindingsError(PyllmError, ImportError):
    """``llama_cpp was already imported with /other/libllama.so: import pyllm_a100 first``"""


class InvalidArgument(PyllmError, ValueError):
    """``--max-tokens -5: must be at least 1``"""


class TensorSplitError(PyllmError, ValueError):
    """``--tensor-split 1x0: the count after x must be at least 1; use e.g. 1x8``"""


class GpuSelectionError(PyllmError, ValueError):
    """``--gpus 0-9: no GPU 8 on this machine (NVML sees 8: 0-7): see nvidia-smi``"""


class ModelError(PyllmError):
    """A model that cannot be served or loaded as given."""


class ModelNotFound(ModelError, FileNotFoundError):
    """``model ./m.gguf does not exist (no such file, nor a fetched name): give a .gguf file, shard 1 of a set, ...``"""


class AmbiguousModel(ModelError, ValueError):
    """``./models holds 2 models (a, b): give one of them, e.g. its shard 1 file``"""


class NotFirstShard(ModelError, ValueError):
    """``m-00002-of-00003.gguf is shard 2 of 3: give shard 1 (m-00001-of-00003.gguf)``"""


class ShardMissing(ModelError, FileNotFoundError):
    """``m-00001-of-00003.gguf is part of a 3-shard set but 1 shard(s) are missing: ...``"""


class NotAGGUF(ModelError, ValueError):
    """``m.bin is not a GGUF file (it starts with b'PK..'): convert it ...``"""


class TruncatedModel(ModelError, ValueError):
    """``m.gguf is truncated or corrupt (1234 bytes): download it again``"""


class ModelUnreadable(ModelError, PermissionError):
    """``m.gguf is not readable by this user: fix its permissions``"""


class UnknownArchitecture(ModelError, ValueError):
    """``model architecture 'x' is unknown to this build's llama.cpp: build a newer source``"""


class StateError(PyllmError, OSError):
    """``PYLLM_HOME=/x is a file, not a folder: point PYLLM_HOME at a folder (or unset it)``"""


class ServerError(PyllmError, RuntimeError):
    """llama-server could not be started or kept running."""


class ServerConfigError(ServerError, ValueError):
    """``--ctx-size 0: must be a positive number of tokens (e.g. 8192)``"""


class PortInUse(ServerError, OSError):
    """``port 8080 on 127.0.0.1 is already in use by PID 123 (...): pass another --port``"""


class ServerDied(ServerError):
    """``llama-server ran out of GPU memory allocating 12.0 GiB on CUDA0: lower --ctx-size ...``"""


class ServerStartTimeout(ServerError, TimeoutError):
    """``llama-server was not ready after 600 s (last log: ...)``"""


class ServerNotFound(ServerError, LookupError):
    """``no managed server named 'x': see pyllm ps``"""


class ServiceError(ServerError):
    """``systemd is not running on this machine (no /run/systemd/system): nothing was installed``"""


class FetchError(PyllmError):
    """``download of x stopped (...); partial files are kept: run the same command again to resume``"""


class RepoNotFound(FetchError, FileNotFoundError):
    """``repository x/y was not found on https://...: check the name (owner/name)``"""


class AccessDenied(FetchError, PermissionError):
    """``x/y is gated or private and this request was not authorized: ... pass a token``"""


class HubUnreachable(FetchError, ConnectionError):
    """``cannot reach https://...: on an intranet set HF_ENDPOINT to your mirror``"""


class NotEnoughDisk(FetchError, OSError):
    """``x/y: 150.0 GiB still to download but /data has 80.0 GiB free``"""


class VerificationFailed(FetchError, ValueError):
    """``x/y: UD-Q8_K_XL/m-00002-of-00005.gguf is corrupt (sha256 ...): run the same command again``"""


class RpcError(ServerError, ConnectionError):
    """``no rpc-server answers at 10.0.0.2:50052 (connection refused): start one there``"""


EX_CONFIG = 78  # sysexits.h: "configuration error"; `pyllm serve` exits with it for CONFIG_ERRORS
# Mistakes in what was asked (flags, model files, PYLLM_HOME) that a restart cannot fix. Not PortInUse,
# RpcError or ServerDied: a port can free up, a worker come back, a crash not recur.
CONFIG_ERRORS: tuple[type[PyllmError], ...] = (
    ServerConfigError, InvalidArgument, TensorSplitError, GpuSelectionError, ModelError, StateError,
)
