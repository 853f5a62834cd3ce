"""Weight sync to an embedded server: gloo broadcast (WeightSender) vs disk (save + /update_weights_from_disk).

For each model size: one embedded server (1 torch thread), perturbed weights; per repeat, in alternating
order (ABBA): "broadcast" = ``WeightSender.send`` over an already formed gloo group (bucketed, default
1 GiB chunks and 4 MiB chunks); "disk" = what the disk path costs the trainer: ``safetensors`` save of
the HF state dict into a fresh directory + ``POST /update_weights_from_disk`` (server reads and loads it).
Both end with the same weights and ``weight_version`` label; the script checks the greedy outputs agree.
Group formation (``/init_weights_update_group``, once per run) is reported separately.

Run: .venv/bin/python benchmarks/weight_sync_throughput.py [--sizes tiny,small] [--repeats 3]
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SIZES = {  # build_tiny_model kwargs
    "tiny": {},
    "small": {"hidden_size": 512, "num_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 64, "intermediate_size": 1536},
}


def _greedy(http) -> list:
    r = http.post("/generate", json={"input_ids": [[5, 17, 33, 40]], "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}})
    r.raise_for_status()
    o = r.json()[0]
    return [o["output_ids"], [t[0] for t in o["meta_info"]["output_token_logprobs"]]]


def run_size(name: str, repeats: int, work: Path) -> dict:
    import httpx
    import torch
    from safetensors.torch import load_file, save_file

    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.rollout.server import EmbeddedServer
    from areal_cli.rollout.weight_sender import WeightSender

    model = build_tiny_model(work / name / "model", seed=0, **SIZES[name])
    base = load_file(str(model / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in sorted(base.items())}
    nbytes = sum(v.numel() * v.element_size() for v in new.values())
    out: dict = {"size": name, "bytes": nbytes, "tensors": len(new), "broadcast_s": [], "broadcast_4mib_s": [],
                 "disk_s": [], "disk_save_s": []}
    version = 0
    with EmbeddedServer.launch(model, max_total_tokens=1024) as srv, httpx.Client(base_url=srv.url,
                                                                                 timeout=600) as http:
        sender = WeightSender([srv.url], backend="gloo", group_name="bench", timeout_s=300)
        t0 = time.perf_counter()
        sender.init()
        out["group_init_s"] = time.perf_counter() - t0

        def broadcast(chunk_mb, key):
            nonlocal version
            version += 1
            st = sender.send(list(new.items()), version, chunk_mb=chunk_mb)
            out[key].append(st["seconds"])
            out[key.replace("_s", "_buckets")] = st["buckets"]

        def disk():
            nonlocal version
            version += 1
            d = work / name / f"v{version}"
            t0 = time.perf_counter()
            shutil.copytree(model, d, ignore=shutil.ignore_patterns("model.safetensors"))
            save_file({k: v.contiguous() for k, v in new.items()}, str(d / "model.safetensors"),
                      metadata={"format": "pt"})
            t1 = time.perf_counter()
            r = http.post("/update_weights_from_disk", json={"model_path": str(d), "weight_version": str(version),
                                                             "abort_all_requests": True})
            assert r.status_code == 200 and r.json()["success"], r.text
            out["disk_s"].append(time.perf_counter() - t0)
            out["disk_save_s"].append(t1 - t0)
            shutil.rmtree(d)

        for i in range(repeats):
            order = [lambda: broadcast(1024, "broadcast_s"), lambda: broadcast(4, "broadcast_4mib_s"), disk]
            for f in (order if i % 2 == 0 else order[::-1]):
                f()
        g_disk = _greedy(http)
        broadcast(1024, "broadcast_s")
        g_bcast = _greedy(http)
        out["greedy_identical"] = g_disk == g_bcast
        sender.close()
    for k in ("broadcast_s", "broadcast_4mib_s", "disk_s", "disk_save_s"):
        out[k + "_median"] = statistics.median(out[k])
    out["disk_over_broadcast"] = out["disk_s_median"] / out["broadcast_s_median"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="", help="also write the results as JSON here")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="areal-wsync-"))
    try:
        results = [run_size(s, args.repeats, work) for s in args.sizes.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    for r in results:
        print(f"{r['size']}: {r['bytes'] / 2**20:.1f} MiB in {r['tensors']} tensors; group init "
              f"{r['group_init_s'] * 1e3:.0f} ms (once); broadcast {r['broadcast_s_median'] * 1e3:.0f} ms "
              f"(4 MiB buckets {r['broadcast_4mib_s_median'] * 1e3:.0f} ms); disk {r['disk_s_median'] * 1e3:.0f} ms "
              f"(save {r['disk_save_s_median'] * 1e3:.0f} ms); disk/broadcast {r['disk_over_broadcast']:.2f}x; "
              f"greedy identical {r['greedy_identical']}")
    print(f"load average {load:.1f}")
    doc = {"results": results, "load_avg_1min": load, "units": "seconds, bytes"}
    print(json.dumps(doc))
    if args.out:
        from areal_cli.foundations.atomic import write_json_atomic

        write_json_atomic(Path(args.out), doc)


if __name__ == "__main__":
    main()
