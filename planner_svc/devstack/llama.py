"""Real engines: a fleet of llama.cpp `llama-server` processes on a tiny random-weight model.

llama-server is a real engine with a real prefix cache (per-slot KV of the last prompt, a
free slot chosen by longest common prefix, a host-RAM prompt cache restored when a slot is
reassigned) that reports `usage.prompt_tokens_details.cached_tokens`. It runs here on CPU;
the model is written with the `gguf` package around a vocabulary-only GGUF from the same
llama.cpp sources (2 layers, dim 64: ~9k prompt tokens/s on one core), so its output is
gibberish but tokenisation, prefill, decode and caching are llama.cpp's own.

    binary   `deploy/llama/build_llama_server.sh DIR` builds it from the llama-cpp-python
             sdist (~8 CPU-minutes on 2 cores; only PyPI is contacted); DIR is
             $CACHEROUTE_LLAMA_DIR or ~/.cache/cacheroute/llama
    model    `write_tiny_model` (pip install 'cacheroute[arena]' for gguf)
    fleet    `start_llama_fleet(workdir, count)`: one process per engine, one thread each
             (two servers must not oversubscribe the cores), on ports chosen here so a
             reset (a restart: cold caches) keeps the engine's address

The arena uses a fleet like the emulator's: `urls`, `destinations()`, `reset(engine)` and
`load(engine)` (prompt tokens served, from the server's own /metrics).
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from planner_svc.devstack.processes import (
    ManagedProcess,
    ServerStartError,
    free_port,
    wait_for_port,
)

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "deploy" / "llama" / "build_llama_server.sh"
SPM_VOCAB = "ggml-vocab-llama-spm.gguf"  # LLaMA's SentencePiece tokenizer, 32k tokens

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def llama_dir() -> Path:
    return Path(os.environ.get("CACHEROUTE_LLAMA_DIR")
                or Path.home() / ".cache" / "cacheroute" / "llama")


def ensure_llama_server(directory: Path | None = None, build: bool = True) -> Path:
    """The llama-server binary, built first if missing (and `build`)."""
    directory = directory or llama_dir()
    binary = directory / "bin" / "llama-server"
    if binary.exists():
        return binary
    if not build:
        raise ServerStartError(f"no llama-server in {directory}: run {BUILD_SCRIPT} {directory}")
    subprocess.run(["bash", str(BUILD_SCRIPT), str(directory)], check=True)
    return binary


def write_tiny_model(out: Path, vocab: Path, *, layers: int = 2, dim: int = 64, heads: int = 4,
                     ctx: int = 16_384, seed: int = 0, std: float = 0.02) -> Path:
    """A random-weight llama GGUF with `vocab`'s tokenizer and a ChatML chat template.
    Deterministic for a seed. Output embeddings are tied to the token embeddings."""
    import gguf  # the arena extra: only this function needs it
    import numpy as np

    reader = gguf.GGUFReader(str(vocab))
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("cacheroute-tiny-random")
    n_vocab = 0
    for key, f in reader.fields.items():  # the tokenizer, verbatim (token strings as bytes)
        if not key.startswith("tokenizer.") or key == "tokenizer.chat_template":
            continue
        main = f.types[0]
        if main == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            val = ([bytes(f.parts[i]) for i in f.data] if sub == gguf.GGUFValueType.STRING
                   else f.contents())
            w.add_key_value(key, val, main, sub_type=sub)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        else:
            w.add_key_value(key, f.contents(), main)
    if not n_vocab:
        raise ValueError(f"{vocab} has no tokenizer.ggml.tokens")
    w.add_chat_template(CHATML)
    head_dim = dim // heads
    w.add_context_length(ctx)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(4 * dim)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10_000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)

    w.add_tensor("token_embd.weight", mat(n_vocab, dim))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(dim, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", mat(dim, dim))
        w.add_tensor(p + "ffn_norm.weight", np.ones(dim, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(4 * dim, dim))
        w.add_tensor(p + "ffn_up.weight", mat(4 * dim, dim))
        w.add_tensor(p + "ffn_down.weight", mat(dim, 4 * dim))
    w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@dataclass(frozen=True)
class LlamaOptions:
    slots: int = 2  # --parallel: prompts whose KV stays in a slot
    slot_tokens: int = 16_384  # context per slot (the longest prompt it accepts)
    cache_ram_mib: int = 32  # host-RAM prompt cache (~527 B per token: ~60k tokens)
    threads: int = 1
    model_name: str = "arena-model"


@dataclass
class LlamaFleet:
    binary: Path
    model: Path
    workdir: Path
    options: LlamaOptions
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, ManagedProcess] = field(default_factory=dict)

    @property
    def urls(self) -> dict[str, str]:
        return {e: f"http://127.0.0.1:{p}" for e, p in self.ports.items()}

    def destinations(self) -> str:
        return ",".join(f"{i}={u}" for i, u in self.urls.items())

    def start(self, engine: str, timeout_s: float = 30.0) -> None:
        o = self.options
        port = self.ports.setdefault(engine, free_port())
        argv = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1",
                "--port", str(port), "--no-ui", "--metrics", "--alias", o.model_name,
                "--parallel", str(o.slots), "-c", str(o.slots * o.slot_tokens),
                "--cache-ram", str(o.cache_ram_mib), "-t", str(o.threads),
                "--chat-template", "chatml"]
        proc = ManagedProcess(engine, argv, self.workdir / f"{engine}.log")
        proc.start()
        assert proc.proc is not None
        if not wait_for_port("127.0.0.1", port, timeout_s, proc.proc) or not self._healthy(
                port, timeout_s):
            proc.stop()
            raise ServerStartError(f"llama-server {engine} did not start:\n{proc.log_tail()}")
        self.processes[engine] = proc

    def _healthy(self, port: int, timeout_s: float) -> bool:
        import time
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # 503 while the model loads
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def reset(self, engine: str) -> None:
        """Cold caches: the engine restarted on its address."""
        self.processes.pop(engine).stop()
        self.start(engine)

    def load(self, engine: str) -> float:
        """Prompt tokens served so far (computed + from cache), from its /metrics."""
        with urllib.request.urlopen(f"{self.urls[engine]}/metrics", timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"):
                total += float(value)
        return total

    def peak_rss_mb(self) -> float:
        return sum(p.peak_rss_mb() for p in self.processes.values())

    def stop(self) -> None:
        for p in self.processes.values():
            p.stop()


def start_llama_fleet(workdir: Path, count: int = 4, options: LlamaOptions | None = None,
                      build: bool = True) -> LlamaFleet:
    """`count` llama-servers (engine-00, ...) on one tiny model, each healthy on return."""
    directory = llama_dir()
    binary = ensure_llama_server(directory, build=build)
    o = options or LlamaOptions()
    model = workdir / "tiny.gguf"
    write_tiny_model(model, directory / "vocab" / SPM_VOCAB, ctx=o.slot_tokens)
    fleet = LlamaFleet(binary, model, workdir, o)
    try:
        for i in range(count):
            fleet.start(f"engine-{i:02d}")
    except BaseException:
        fleet.stop()
        raise
    return fleet
