#!/usr/bin/env python3
"""Trains replayssm's built-in model and exports reference logits for the C++ runner's tests.

The model is a Hugging Face Mamba2ForCausalLM with a byte vocabulary (256 tokens, token id =
byte value), trained for a fixed wall-clock budget on the Python standard library's own source
files (*.py of the interpreter that runs this script; Python Software Foundation License v2),
which are on every machine with Python and need no download.

Outputs (under --out):
  config.json, model.safetensors  the model in bf16, saved by transformers' save_pretrained, with
                                  two replayssm keys added to config.json (tokenizer, no EOS)
  reference.safetensors           for a few prompts: the prompt's byte ids (I32 [T]), the fp32
                                  logits of transformers' Mamba2ForCausalLM on the bf16 weights
                                  widened to fp32, on the CPU (F32 [T, 256]), and 48 greedy tokens
                                  from a cache-free greedy loop (I32 [48])
  train.json                      what was trained on and how it went

Run: python3 scripts/train_tiny_mamba2.py --out DIR [--seconds 150]  (needs a CUDA GPU,
PyTorch and transformers; only the transformers PyTorch path is used, no mamba_ssm kernels).
"""
import argparse
import glob
import json
import math
import os
import sys
import sysconfig
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Mamba2Config, Mamba2ForCausalLM  # noqa: E402

# Prompts of the reference logits: code-like text written for this project.
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Config:\n    def __init__(self, name, value=None):\n        self.name = name\n        self.",
    "    for i in range(len(items)):\n        if items[i] is None:\n            continue\n",
    '    def read(self, size=-1):\n        """Read and return up to size bytes."""\n        if ',
]
GREEDY_TOKENS = 48


def load_corpus(max_bytes):
    """Concatenates the standard library's .py files (sorted paths, site-packages skipped)."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    files = [f for f in files if "site-packages" not in f and "dist-packages" not in f]
    data = bytearray()
    used = 0
    for path in files:
        try:
            with open(path, "rb") as fh:
                data += fh.read() + b"\n"
            used += 1
        except OSError:
            continue
        if len(data) >= max_bytes:
            break
    return bytes(data[:max_bytes]), root, used


def make_config():
    return Mamba2Config(
        vocab_size=256,
        hidden_size=256,
        num_hidden_layers=6,
        state_size=64,
        num_heads=8,
        head_dim=64,
        n_groups=1,
        expand=2,
        conv_kernel=4,
        chunk_size=64,
        use_bias=False,
        use_conv_bias=True,
        layer_norm_epsilon=1e-5,
        residual_in_fp32=True,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )


def lr_at(step, frac, base):
    warm = min(1.0, (step + 1) / 100.0)
    return base * warm * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-bytes", type=int, default=48 << 20)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    corpus, root, nfiles = load_corpus(args.max_bytes)
    print(f"corpus: {len(corpus)} bytes from {nfiles} files under {root}", flush=True)
    data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8).to("cuda").long()
    split = int(len(data) * 0.98)
    train, val = data[:split], data[split:]

    config = make_config()
    model = Mamba2ForCausalLM(config).to("cuda")
    nparams = sum(p.numel() for p in model.parameters())
    print(f"parameters: {nparams}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95))
    offsets = torch.arange(args.seq + 1, device="cuda")

    def batch_from(src, n):
        idx = torch.randint(0, len(src) - args.seq - 1, (n,), device="cuda")
        return src[idx[:, None] + offsets[None, :]]

    def loss_of(x):
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
        return F.cross_entropy(logits.reshape(-1, 256).float(), x[:, 1:].reshape(-1))

    model.train()
    # One probe step: fall back to a smaller batch if the naive (einsum-free) SSD path of
    # transformers does not fit, rather than lose the run.
    while True:
        try:
            loss_of(batch_from(train, args.batch)).backward()
            opt.zero_grad(set_to_none=True)
            break
        except torch.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            if args.batch <= 4:
                raise
            args.batch //= 2
            print(f"out of memory: batch {args.batch}", flush=True)
    t0 = time.time()
    step = 0
    losses = []
    while True:
        elapsed = time.time() - t0
        if elapsed >= args.seconds:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, elapsed / args.seconds, args.lr)
        loss = loss_of(batch_from(train, args.batch))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            print(f"step {step} t {elapsed:.0f}s loss {loss.item():.3f}", flush=True)
        step += 1
    train_time = time.time() - t0
    model.eval()
    with torch.no_grad():
        val_loss = sum(loss_of(batch_from(val, 32)).item() for _ in range(8)) / 8
    tail = sum(losses[-50:]) / max(1, len(losses[-50:]))
    print(f"trained {step} steps in {train_time:.0f}s; train loss {tail:.3f}, "
          f"val loss {val_loss:.3f} nats/byte", flush=True)

    # Save in bf16 the way transformers does, then mark the byte tokenizer and drop the EOS.
    model_bf16 = model.to("cpu").to(torch.bfloat16)
    model_bf16.save_pretrained(args.out)
    cfg_path = os.path.join(args.out, "config.json")
    with open(cfg_path) as fh:
        text = fh.read()
    print("config.json as saved:\n" + text, flush=True)
    # Python's json reads and writes the bare Infinity of time_step_limit.
    cfg = json.loads(text)
    cfg["replayssm_tokenizer"] = "byte"
    cfg["eos_token_id"] = None
    cfg["pad_token_id"] = None
    cfg["bos_token_id"] = None
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
        fh.write("\n")

    # Reference: the bf16 weights widened to fp32, transformers' own forward on the CPU.
    ref = Mamba2ForCausalLM(config)
    state = {k: v.float() for k, v in model_bf16.state_dict().items()}
    missing, unexpected = ref.load_state_dict(state, strict=False)
    print(f"reference load: missing {missing} unexpected {unexpected}", flush=True)
    ref = ref.float().eval()
    tensors = {}
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ids = list(prompt.encode("utf-8"))
            x = torch.tensor([ids], dtype=torch.long)
            logits = ref(input_ids=x, use_cache=False).logits[0].float().contiguous()
            tensors[f"p{i}.tokens"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"p{i}.logits"] = logits
            seq = list(ids)
            for _ in range(GREEDY_TOKENS):  # cache-free greedy: a full forward per token
                out = ref(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False)
                seq.append(int(out.logits[0, -1].argmax()))
            tensors[f"p{i}.greedy"] = torch.tensor(seq[len(ids):], dtype=torch.int32)
            print(f"prompt {i}: {prompt!r} -> {bytes(seq[len(ids):]).decode('utf-8', 'replace')!r}",
                  flush=True)
    save_file(tensors, os.path.join(args.out, "reference.safetensors"), metadata={"format": "pt"})

    info = {
        "corpus": "Python standard library source (*.py), Python Software Foundation License v2",
        "corpus_root": root, "corpus_files": nfiles, "corpus_bytes": len(corpus),
        "parameters": nparams, "steps": step, "batch": args.batch, "seq": args.seq,
        "train_seconds": round(train_time, 1), "train_loss": round(tail, 4),
        "val_loss": round(val_loss, 4), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "python": sys.version.split()[0], "gpu": torch.cuda.get_device_name(0),
    }
    with open(os.path.join(args.out, "train.json"), "w") as fh:
        json.dump(info, fh, indent=2)
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
