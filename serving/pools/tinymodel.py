"""A tiny, deterministic Llama model that real vLLM can serve on CPU, generated locally in seconds.

No model hub is reachable from these machines, so the project makes its own model: a byte-level BPE
tokenizer (vocabulary ~1k) trained with the ``tokenizers`` library on text generated here from a seeded
word list, and a randomly initialised ``LlamaForCausalLM`` (hidden 256, 2 layers, 4 heads, 2 KV heads,
2048 positions) saved as safetensors. The weights are random: outputs are gibberish, but greedy decoding
is deterministic and the compute shape is a real Llama's, which is all serving tests and latency
measurements need.

``build_tiny_model(out_dir, seed=0)`` is idempotent: a marker file records a hash of everything that
determines the output; a directory whose marker matches is reused as is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

MARKER_FILE = "pdscale_tiny_model.json"
# Bump when anything below changes what lands on disk: a stale marker then no longer matches.
GENERATOR_VERSION = 1

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A fixed word list: the corpus is drawn from it with a seeded generator, so the tokenizer trained on
# it is the same on every machine and Python version (unlike, say, the stdlib's source files).
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an they you were her she there would their we him been has when who will more no if out so said what "
    "up its about into than them can only other new some could time these two may then do first any my now "
    "such like our over man me even most made after also did many before must through back years where much "
    "your way well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three prefill decode "
    "token batch cache latency request server model queue burst scale replica forecast policy tensor "
    "kernel memory block prompt output stream metric gauge counter histogram router pool node instance"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines the generated files (hashed into the marker)."""

    seed: int = 0
    vocab_size: int = 1024
    hidden_size: int = 256
    intermediate_size: int = 1024  # as the cpu-tiny HardwareProfile in serving/sim/hardware.py
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    corpus_words: int = 60_000
    generator_version: int = GENERATOR_VERSION

    def digest(self) -> str:
        """SHA-256 of the spec's canonical JSON."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


def _corpus(spec: TinyModelSpec) -> list[str]:
    """Deterministic pseudo-English lines, plus digits and punctuation so every byte class occurs."""
    rng = np.random.default_rng(spec.seed)
    # Zipf-like word frequencies make BPE learn whole words for the common ones.
    weights = 1.0 / np.arange(1, len(_WORDS) + 1)
    idx = rng.choice(len(_WORDS), size=spec.corpus_words, p=weights / weights.sum())
    numbers = rng.integers(0, 10_000, size=spec.corpus_words // 20)
    lines: list[str] = []
    words = [_WORDS[i] for i in idx]
    for k, start in enumerate(range(0, len(words), 20)):
        sentence = " ".join(words[start : start + 20])
        lines.append(f"{sentence.capitalize()}, {int(numbers[k % len(numbers)])}.")
    return lines


def _train_tokenizer(spec: TinyModelSpec) -> object:
    """A byte-level BPE tokenizer wrapped as ``PreTrainedTokenizerFast`` (returned untyped: no stubs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec), trainer=trainer)
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )


def _write_model(spec: TinyModelSpec, tokenizer: object, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = len(tokenizer)  # type: ignore[arg-type]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(out, safe_serialization=True)


def is_built(out_dir: Path, spec: TinyModelSpec | None = None) -> bool:
    """True when ``out_dir`` holds a complete model generated from ``spec``."""
    spec = spec or TinyModelSpec()
    marker = Path(out_dir) / MARKER_FILE
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return bool(recorded.get("digest") == spec.digest())


def build_tiny_model(out_dir: str | os.PathLike[str], seed: int = 0) -> Path:
    """Generate the tiny model into ``out_dir`` (or reuse it when already built) and return the path.

    The files are written to a sibling temporary directory and renamed into place, so concurrent builders
    and interrupted builds never leave a half-written model behind a valid marker. Example::

        model_dir = build_tiny_model("out/tiny-llama")
        # python -m vllm.entrypoints.openai.api_server --model out/tiny-llama ...
    """
    out = Path(out_dir).resolve()
    spec = TinyModelSpec(seed=seed)
    if is_built(out, spec):
        return out
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(
            f"{out}: exists and is not a tiny model built with seed={seed} "
            f"(no matching {MARKER_FILE}); choose another directory or remove it"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is meant to be shared by server processes
    try:
        tokenizer = _train_tokenizer(spec)
        tokenizer.save_pretrained(tmp)  # type: ignore[attr-defined]
        _write_model(spec, tokenizer, tmp)
        (tmp / MARKER_FILE).write_text(
            json.dumps({"digest": spec.digest(), "spec": asdict(spec)}, indent=2, sort_keys=True) + "\n"
        )
        if out.exists():
            out.rmdir()  # empty (checked above)
        try:
            tmp.rename(out)
        except OSError:
            if not is_built(out, spec):  # lost a race to another builder only if it produced the same
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def normal_token_ids(model_dir: str | os.PathLike[str]) -> np.ndarray:
    """Ids of the ordinary (non-special) tokens of a built tiny model, sorted (int64).

    Load generators draw prompts from these, so a prompt of ``n`` ids is exactly ``n`` prompt tokens.
    """
    data = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    special = {int(t["id"]) for t in data.get("added_tokens", [])}
    ids = sorted(int(i) for i in data["model"]["vocab"].values() if int(i) not in special)
    if not ids:
        raise ValueError(f"{model_dir}/tokenizer.json: no ordinary tokens in model.vocab")
    return np.asarray(ids, dtype=np.int64)
