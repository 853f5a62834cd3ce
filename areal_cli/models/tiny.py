"""Tiny Qwen3 causal LM with a locally trained byte-level BPE tokenizer and a Qwen-style chat template.

This is the model every CPU path of ``areal`` uses (the embedded default, the tests, the ``tiny-arith``
recipe). :func:`build_tiny_model` writes an ordinary Hugging Face model directory, so the same code that
loads a real Qwen3 checkpoint loads this one:

- ``config.json``            ``Qwen3ForCausalLM``; ``eos_token_id`` = id of ``<|im_end|>``,
                             ``pad_token_id`` = id of ``<|endoftext|>``, ``tie_word_embeddings`` False.
- ``model.safetensors``      float32 weights, randomly initialised from ``seed`` (byte-identical per seed).
- ``tokenizer.json``         byte-level BPE trained with the ``tokenizers`` library on ``corpus``.
- ``tokenizer_config.json``  ``PreTrainedTokenizerFast`` + the chat template.
- ``generation_config.json`` eos / pad ids.

Tokenizer (measured facts in DESIGN.md §1): special tokens ``<|endoftext|>`` (id 0, pad),
``<|im_start|>`` (id 1), ``<|im_end|>`` (id 2, eos); then the 256 byte symbols, then BPE merges up to
``vocab_size``. Pre-tokenisation splits every digit into its own piece, so a number is always one token per
digit ("123" -> "1", "2", "3"), and merges never cross a digit. Being byte-level, ANY text (unicode, LaTeX,
the AIME problems) tokenises with no unknown token.

Chat template (Qwen style)::

    <|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A little generic text so that instructions used by the eval prompts merge into few tokens. Any text
# tokenises anyway (byte-level BPE); this only shapes the merges.
GENERIC_TEXT: tuple[str, ...] = (
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "Answer in \\boxed{}. The answer is \\boxed{42}.",
    "Solve the following math problem. Give only the final answer.",
    "Find the number of positive integers $n$ such that $n^2 + 1$ is divisible by $5$.",
    "Let $x$ and $y$ be real numbers with $x + y = 10$ and $xy = 21$. What is $x^2 + y^2$?",
    "The sum of the digits of the answer, the product of two numbers, the remainder when divided by 1000.",
    "Compute the value of the expression. What is the result? Reverse the string. Sort the digits.",
    "user assistant system You are a helpful assistant.",
)


def default_corpus() -> list[str]:
    """The default tokenizer training corpus: ``tiny-arith`` prompts and answers plus :data:`GENERIC_TEXT`.

    Returns a list of strings (deterministic; no randomness involved).
    """
    from areal_cli.tasks import tiny_arith

    return list(tiny_arith.tokenizer_corpus()) + list(GENERIC_TEXT)


R1_BOS, R1_EOS, R1_USER, R1_ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
THINK_TOKENS = ("<think>", "</think>")

#: DeepSeek-R1(-Distill)'s chat template, reduced to user/assistant turns (generation prompt opens <think>).
R1_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}{{- '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- else %}{{- message['content'] }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class ChatFormat:
    """Special tokens and chat template of a tiny model's tokenizer (``model.chat_template``).

    ``special``: special tokens in id order (ids 0..); ``added``: non-special added tokens (kept by
    ``decode(skip_special_tokens=True)``, as Qwen3's and R1's ``<think>``); ``bos``: prepended when a text is
    tokenised with special tokens (R1 does this; ChatML models add nothing).
    """

    name: str
    special: tuple[str, ...]
    added: tuple[str, ...]
    pad: str
    eos: str
    bos: str | None
    template: str


CHAT_FORMATS = {
    "chatml": ChatFormat("chatml", SPECIAL_TOKENS, (), PAD_TOKEN, IM_END, None, CHAT_TEMPLATE),
    "qwen3": ChatFormat("qwen3", SPECIAL_TOKENS, THINK_TOKENS, PAD_TOKEN, IM_END, None, CHAT_TEMPLATE),
    "r1": ChatFormat("r1", (R1_EOS, R1_BOS, R1_USER, R1_ASSISTANT), THINK_TOKENS, R1_EOS, R1_EOS, R1_BOS,
                     R1_CHAT_TEMPLATE),
}


def train_tokenizer(corpus: Iterable[str], vocab_size: int, special_tokens: tuple[str, ...] = SPECIAL_TOKENS
                    ) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``corpus`` (deterministic for a given corpus and size).

    Args:
        corpus: training texts.
        vocab_size: target vocabulary size including the special tokens and the 256 byte symbols; must be
            >= 256 + len(special_tokens). The result has at most ``vocab_size`` tokens (fewer when the corpus
            offers fewer merges).
        special_tokens: ids 0.. in this order.
    Raises:
        ValueError: ``vocab_size`` too small.
    """
    n_base = len(special_tokens) + 256
    if vocab_size < n_base:
        raise ValueError(f"vocab_size must be >= {n_base} ({len(special_tokens)} special tokens + 256 bytes), "
                         f"got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Sorted + deduplicated input: the merges then do not depend on the iteration order of the caller.
    texts = sorted(set(corpus))
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(special_tokens):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 512,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 32,
    intermediate_size: int = 384,
    max_position_embeddings: int = 2048,
    rope_theta: float = 10000.0,
    chat_template: str = "chatml",
    family: str = "qwen3",
    tie_word_embeddings: bool = False,
    rope_parameters: dict | None = None,
) -> Path:
    """Write a randomly initialised tiny Qwen3 model directory (weights, config, tokenizer, templates).

    Defaults give 482 816 parameters (vocab 347 with the default corpus, hidden 128, 2 layers, GQA 4 query /
    2 KV heads of dim 32, MLP 384), float32, 1.9 MB. This is the size the ``tiny-arith`` recipe was tuned
    for (see :mod:`areal_cli.tasks.tiny_arith`).

    Args:
        out_dir: directory to create/overwrite files in.
        seed: seeds ``torch`` for the weight initialisation; same seed and arguments -> byte-identical
            ``model.safetensors`` and identical ``tokenizer.json``.
        corpus: tokenizer training texts; default :func:`default_corpus`.
        vocab_size: requested vocabulary size (the config uses the trained tokenizer's actual size, which
            is <= this).
        hidden_size, num_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
        max_position_embeddings, rope_theta: ``Qwen3Config`` fields.
        chat_template: the tokenizer's special tokens and chat template (:data:`CHAT_FORMATS`): ``chatml``
            (default), ``qwen3`` (ChatML + ``<think>``/``</think>``) or ``r1`` (DeepSeek-R1's markers and BOS).
        family: ``qwen3`` (default), ``qwen2`` or ``llama`` (:mod:`areal_cli.models.families`): the HF config
            class, hence q/k norms (Qwen3) or q/k/v biases (Qwen2).
        tie_word_embeddings: share the output layer with the embedding.
        rope_parameters: the config's rope parameters (default ``{"rope_type": "default", "rope_theta": ...}``;
            e.g. Llama-3 scaling for ``llama``).
    Returns:
        ``Path(out_dir)``.
    Raises:
        ValueError: invalid sizes (``vocab_size`` < 259, heads not dividing).
    """
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config, Qwen3Config

    configs = {"qwen3": Qwen3Config, "qwen2": Qwen2Config, "llama": LlamaConfig}
    if family not in configs:
        raise ValueError(f"family must be one of {sorted(configs)}, got {family!r}")

    if num_attention_heads % num_key_value_heads != 0:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    if chat_template not in CHAT_FORMATS:
        raise ValueError(f"chat_template must be one of {sorted(CHAT_FORMATS)}, got {chat_template!r}")
    fmt = CHAT_FORMATS[chat_template]
    tok = train_tokenizer(default_corpus() if corpus is None else corpus, vocab_size, fmt.special)
    if fmt.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fmt.added])
    if fmt.bos is not None:  # R1 tokenizers prepend BOS to any text tokenised with special tokens
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fmt.bos} $A", pair=f"{fmt.bos} $A {fmt.bos} $B", special_tokens=[(fmt.bos, tok.token_to_id(fmt.bos))])
    tok.save(str(out / "tokenizer.json"))
    pad_id, eos_id = tok.token_to_id(fmt.pad), tok.token_to_id(fmt.eos)
    bos_id = tok.token_to_id(fmt.bos) if fmt.bos is not None else None
    extra_special = [t for t in fmt.special if t not in (fmt.pad, fmt.eos, fmt.bos)]
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_position_embeddings,
        "pad_token": fmt.pad,
        "eos_token": fmt.eos,
        "bos_token": fmt.bos,
        "unk_token": None,
        "additional_special_tokens": extra_special,
        "add_bos_token": fmt.bos is not None,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": fmt.template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"pad_token": fmt.pad, "eos_token": fmt.eos, **({"bos_token": fmt.bos} if fmt.bos else {}),
                    "additional_special_tokens": extra_special}, indent=2) + "\n"
    )

    extra = {"use_sliding_window": False} if family == "qwen2" else {}
    config = configs[family](
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        use_cache=True,
        dtype="float32",
        **extra,
    )
    from areal_cli.models.families import FAMILIES

    config.architectures = [FAMILIES[family].architecture]
    # Initialisation under a private RNG state so the caller's global RNG is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    config.save_pretrained(out)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True, temperature=1.0,
                     top_p=1.0, top_k=0).save_pretrained(out)
    # Own safetensors writer: sorted names, contiguous float32, fixed metadata -> byte-identical per seed.
    state = {k: v.detach().contiguous().clone() for k, v in sorted(model.state_dict().items())
             if not (tie_word_embeddings and k == "lm_head.weight")}  # a tied output layer is the embedding
    tmp = out / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / "model.safetensors")
    return out


def load_tokenizer(model_dir: str | Path):
    """Load the tokenizer of a model directory as a ``transformers.PreTrainedTokenizerFast``.

    The returned tokenizer has ``pad_token`` ``<|endoftext|>``, ``eos_token`` ``<|im_end|>`` and the chat
    template from ``tokenizer_config.json``.
    Raises:
        FileNotFoundError: no ``tokenizer.json`` in ``model_dir``.
    """
    from transformers import PreTrainedTokenizerFast

    d = Path(model_dir)
    if not (d / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{d}: no tokenizer.json")
    return PreTrainedTokenizerFast.from_pretrained(str(d))


def chat_prompt_ids(tokenizer, user_text: str) -> list[int]:
    """Token ids of a one-turn chat prompt with the generation prompt appended.

    ``<|im_start|>user\\n{user_text}<|im_end|>\\n<|im_start|>assistant\\n`` -> ``list[int]``.
    """
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in some transformers versions
        ids = ids["input_ids"]
    return [int(i) for i in ids]
