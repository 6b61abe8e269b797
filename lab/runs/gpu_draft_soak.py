"""The serving soak with a draft (a patch's "0 crashes in the soak" for speculative decoding): lab.bench.soak against
one gpu-build's llama-server serving WORK/TARGET.gguf with WORK/TARGET-DRAFT.gguf at --draft-max K, optionally at a
synthetic acceptance (--spec-synth-len) so that every verify width and accepted length occurs, with --parallel slots
sharing one KV pool (pyllm serve's default). Prompts of every length alone, then waves of concurrent requests.

    python -m lab.runs.gpu_draft_soak --work /tmp/dec --build cand --target v4-43l --draft dspark --draft-max 5 \
        --synth-len 2.5 --out DIR/gpu-draft-soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time



def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="gpu-build's work folder (LABEL-bin/, the GGUF files)")
    ap.add_argument("--build", required=True, help="the build's label (WORK/LABEL-bin/llama-server)")
    ap.add_argument("--target", default="v4-43l", help="WORK/TARGET.gguf")
    ap.add_argument("--draft", default="dspark", help="WORK/TARGET-DRAFT.gguf")
    ap.add_argument("--draft-max", type=int, default=5)
    ap.add_argument("--synth-len", type=float, default=None, help="llama-server's --spec-synth-len (mean accepted length)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=64, help="prompt lengths 1..N alone")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--n-predict", type=int, default=24)
    ap.add_argument("--out", required=True, help="the JSON result")
    a = ap.parse_args(argv)
    if a.draft_max < 1 or a.parallel < 1 or a.max_length < 1 or a.n_predict < 1:
        ap.error("--draft-max, --parallel, --max-length and --n-predict must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    from lab.bench.native_view import native_view
    from lab.bench.soak import soak

    binary = os.path.join(a.work, f"{a.build}-bin", "llama-server")
    model = os.path.join(a.work, f"{a.target}.gguf")
    draft = os.path.join(a.work, f"{a.target}-{a.draft}.gguf")
    for path in (binary, model, draft):
        if not os.path.exists(path):
            print(f"gpu-draft-soak: {path} is missing (run gpu-build {a.build} / gpu-multitoken models first)", file=sys.stderr)
            return 1
    extra = ["--spec-synth-len", str(a.synth_len)] if a.synth_len is not None else []
    # the package's Server checks its native folder (build_info.json, templates): show it this build's (the device's
    # templates-only folder made the nineteenth run's queued soak fail), its libraries found beside the programs
    os.environ["PYLLM_NATIVE_DIR"] = native_view(a.work, a.build)
    os.environ["LD_LIBRARY_PATH"] = os.path.join(a.work, f"{a.build}-bin")
    started = time.time()
    try:
        result = soak(model, lengths=range(1, a.max_length + 1), concurrency=[int(c) for c in a.concurrency.split(",")],
                      n_predict=a.n_predict, log_path=os.path.splitext(a.out)[0] + ".log", parallel=a.parallel,
                      n_gpu_layers=999, server_binary=binary, draft=draft, draft_max=a.draft_max, extra_args=extra)
    except Exception as exc:  # a server that never starts is a failed soak, with its reason
        result = {"error": f"{type(exc).__name__}: {exc}"[:600], "crashes": 0, "http_errors": 0, "requests": 0}
    record = {"build": a.build, "target": a.target, "draft": a.draft, "draft_max": a.draft_max,
              "synth_len": a.synth_len, "parallel": a.parallel, "seconds": round(time.time() - started, 1), **result}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2, default=str)
    os.replace(tmp, a.out)
    print(f"gpu-draft-soak {a.build}: {result.get('requests')} requests, {result.get('http_errors')} HTTP errors, "
          f"{result.get('crashes')} crashes{' ERROR ' + result['error'] if result.get('error') else ''}")
    return 1 if result.get("error") or result.get("crashes") or result.get("http_errors") else 0


if __name__ == "__main__":
    sys.exit(main())
