"""Named evaluation protocols: the exact prompt string and the sampling preset of a published setup.

``--protocol NAME`` picks one; explicit flags override single settings (:func:`apply_overrides`), and the
protocol in force (:meth:`Protocol.to_dict`, with the overridden keys) goes into results.json.

| name | kind | prompt | T | top_p | top_k | n | max new | greedy pass | source |
|---|---|---|---|---|---|---|---|---|---|
| ``qwen3-think`` | math | AReaL ``qwen3-think`` | 1.0 | 0.95 | -1 | 32 | 32768 | yes | AReaL v0.3 eval guide |
| ``qwen3-think-pure`` | code | AReaL ``qwen3-think-pure`` | 1.0 | 0.95 | -1 | 8 | 32768 | yes | AReaL v0.3 eval guide |
| ``r1-distill`` | math | AReaL ``r1-distilled-qwen`` | 0.6 | 0.95 | -1 | 64 | 32768 | no | DeepSeek-R1 paper |
| ``r1-distill-pure`` | code | AReaL ``r1-distilled-pure`` | 0.6 | 0.95 | -1 | 64 | 32768 | no | DeepSeek-R1 paper |
| ``greedy`` | any | model chat template | 0 | 1 | -1 | 1 | 512 | no | -- |
| ``chat-template`` | any | model chat template | 0.6 | 0.95 | -1 | 1 | 512 | no | this CLI's default |

Sources (inclusionAI/AReaL @ v0.3.0, see /work/shared/reference/areal_v03_published.md section (d)):

- Prompt strings: ``evaluation/utils.py`` ``PROMPT_TEMPLATES[name][0]``, written here after Python's
  ``str.format`` has turned ``\\\\boxed{{}}`` into ``\\\\boxed{}``; ``construct_prompt`` fills ``{input}``
  and strips spaces (``.strip(" ")``) from the ends. The math driver (``math_eval.py``) takes ``{input}``
  from Qwen2.5-Math ``parse_question``, which ``.strip()``s the question (``strip_input``); ``code_eval.py``
  inserts the question as stored.
- Stop strings: both drivers stop on ``</s>``, ``<|im_end|>``, ``<|endoftext|>``. ``math_eval.py`` adds
  ``"\\n\\n\\n"`` for prompt types containing "pure"; ``code_eval.py`` does not, and ``qwen3-think-pure``
  is the code protocol (AReaL's eval guide: ``qwen3-think`` for math, ``qwen3-think-pure`` for code), so
  it has no ``"\\n\\n\\n"`` stop here. (vLLM's ``stop_token_ids [151645, 151643]`` "if 'qwen2' in the
  model path" is the model's EOS handling, which the runner does from the model's own config.)
- Sampling: ``eval_and_aggregate.py`` runs one greedy pass (seed 0, T=0, n=1, top_p=1) plus
  ``num_sample_nodes x samples_per_node`` samples (default 8x4 = 32) at ``--temperature`` (code default 0.6),
  ``--top_p`` 0.95, ``--top_k`` -1, ``--max_gen_tokens`` 32768. The eval guide (docs/tutorial/eval.md)
  states 32 samples at temperature 1.0 for math and 8 samples (8 nodes x 1) for code, and the README
  quickstart passes ``--temperature 1.0``; the presets follow the guide (pass ``--temperature 0.6`` for the
  code's default).
- DeepSeek-R1 (arXiv 2501.12948, section 3 "Evaluation Setup"): maximum generation length 32,768 tokens;
  pass@1 from k samples at temperature 0.6, top-p 0.95, k = 64 for AIME (4..64 by test-set size), no
  greedy decoding; the usage notes ask math prompts to include "Please reason step by step, and put your
  final answer within \\\\boxed{}." and the response to start with ``<think>\\n`` -- which is AReaL's
  ``r1-distilled-qwen`` string.
- Tokenisation: AReaL hands vLLM the prompt text, which tokenises with special tokens on
  (``add_special_tokens``): the R1-Distill tokenizer then prepends ``<｜begin▁of▁sentence｜>``, Qwen3's adds
  nothing. ``chat-template`` / ``greedy`` prompts already hold the template's special tokens (off).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from areal_cli.foundations.errors import UserError

#: AReaL's stop words (``math_eval.py`` / ``code_eval.py`` ``stop_words``).
AREAL_STOP = ("</s>", "<|im_end|>", "<|endoftext|>")

QWEN3_THINK = (
    "<|im_start|>user\n{input}\nPlease reason step by step, and put your final answer within "
    "\\boxed{}./think<|im_end|>\n<|im_start|>assistant\n<think>"
)
QWEN3_THINK_PURE = "<|im_start|>user\n{input}\n/think<|im_end|>\n<|im_start|>assistant\n<think>"
R1_DISTILLED_QWEN = (
    "<｜User｜>{input}\nPlease reason step by step, and put your final answer within "
    "\\boxed{}.<｜Assistant｜><think>\n"
)
R1_DISTILLED_PURE = "<｜User｜>{input}<｜Assistant｜><think>\n"

#: Chat-markup pieces a fixed template relies on; the tokenizer must know each as one token.
TEMPLATE_MARKERS = ("<|im_start|>", "<|im_end|>", "<｜User｜>", "<｜Assistant｜>", "<think>")
OVERRIDABLE = ("temperature", "top_p", "top_k", "n_samples", "max_new_tokens", "greedy_pass")


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol.

    Attributes:
        name: ``--protocol`` value.
        kind: ``"math"``, ``"code"`` or ``"any"`` (benchmarks it is meant for).
        template: the prompt string with one ``{input}`` placeholder, verbatim; None = the model's own
            chat template around :func:`areal_cli.eval.prompts.user_message`.
        temperature: sampling temperature (0 = greedy).
        top_p: nucleus mass in (0, 1]. top_k: -1 = off, else >= 1.
        n_samples: sampled completions per problem (pass@k for k <= n, maj@n).
        max_new_tokens: generation budget per completion (tokens).
        stop: stop strings (the completion is cut at the first one).
        greedy_pass: also run one greedy completion per problem (AReaL ``greedy_acc``).
        add_special_tokens: tokenise the rendered prompt with the tokenizer's special tokens (BOS).
        strip_input: ``.strip()`` the problem text before filling ``{input}``.
        source: where the strings and numbers come from.
        overrides: settings replaced by explicit options (:func:`apply_overrides`).
    """

    name: str
    kind: str
    template: str | None
    temperature: float
    top_p: float
    top_k: int
    n_samples: int
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    greedy_pass: bool = False
    add_special_tokens: bool = False
    strip_input: bool = False
    source: str = ""
    overrides: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able record of the protocol in force (for results.json)."""
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        d["overrides"] = list(self.overrides)
        d["prompt"] = "chat_template" if self.template is None else "fixed_string"
        return d


_AREAL = "inclusionAI/AReaL v0.3.0 evaluation/utils.py PROMPT_TEMPLATES"
PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol("qwen3-think", "math", QWEN3_THINK, 1.0, 0.95, -1, 32, 32768, AREAL_STOP, True, True, True,
                 f"{_AREAL}['qwen3-think']; math_eval.py stop words; docs/tutorial/eval.md: 32 samples, "
                 "temperature 1.0, plus the greedy run of eval_and_aggregate.py"),
        Protocol("qwen3-think-pure", "code", QWEN3_THINK_PURE, 1.0, 0.95, -1, 8, 32768, AREAL_STOP, True, True,
                 False,
                 f"{_AREAL}['qwen3-think-pure']; code_eval.py stop words (no \"\\n\\n\\n\"); "
                 "docs/tutorial/eval.md: code uses 8 samples (8 nodes x 1), temperature 1.0, plus the greedy run"),
        Protocol("r1-distill", "math", R1_DISTILLED_QWEN, 0.6, 0.95, -1, 64, 32768, AREAL_STOP, False, True, True,
                 f"{_AREAL}['r1-distilled-qwen']; DeepSeek-R1 (arXiv 2501.12948) evaluation setup: "
                 "64 samples, temperature 0.6, top-p 0.95, 32768 tokens"),
        Protocol("r1-distill-pure", "code", R1_DISTILLED_PURE, 0.6, 0.95, -1, 64, 32768, AREAL_STOP, False, True,
                 False,
                 f"{_AREAL}['r1-distilled-pure']; DeepSeek-R1 (arXiv 2501.12948) evaluation setup: "
                 "64 samples, temperature 0.6, top-p 0.95, 32768 tokens"),
        Protocol("greedy", "any", None, 0.0, 1.0, -1, 1, 512, (), False, False, False,
                 "the model's chat template; greedy decoding (AReaL's greedy run: T=0, top_p=1, n=1)"),
        Protocol("chat-template", "any", None, 0.6, 0.95, -1, 1, 512, (), False, False, False,
                 "the model's chat template with the boxed-answer instruction (areal_cli.eval.prompts); "
                 "the CLI's sampling defaults; the only protocol the tiny default model's tokenizer supports"),
    )
}


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name``.

    Raises:
        UserError: unknown name (the message lists the known ones).
    """
    if name not in PROTOCOLS:
        raise UserError(f"unknown protocol '{name}'; known protocols: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def apply_overrides(protocol: Protocol, **options: Any) -> Protocol:
    """``protocol`` with the explicitly given options (not None) replacing its preset, validated, and
    their names recorded in ``overrides``.

    Options: ``temperature`` (>= 0), ``top_p`` (0 < p <= 1), ``top_k`` (-1 or >= 1), ``n_samples`` (>= 1),
    ``max_new_tokens`` (>= 1), ``greedy_pass`` (bool).

    Raises:
        UserError: an unknown option or an out-of-range value (``option 'top_p': must be in (0, 1], got 0``).
    """
    changes: dict[str, Any] = {}
    for key, value in options.items():
        if key not in OVERRIDABLE:
            raise UserError(f"option '{key}' is not a protocol setting (settings: {', '.join(OVERRIDABLE)})")
        if value is not None:
            changes[key] = value
    merged = dataclasses.replace(protocol, **changes)
    validate(merged)
    new = tuple(k for k in OVERRIDABLE if k in changes and changes[k] != getattr(protocol, k))
    return dataclasses.replace(merged, overrides=tuple(dict.fromkeys(protocol.overrides + new)))


def validate(protocol: Protocol) -> None:
    """Check the sampling settings.

    Raises:
        UserError: ``option '<name>': must be ..., got ...``.
    """
    def bad(name: str, rule: str) -> UserError:
        return UserError(f"option '{name}': must be {rule}, got {getattr(protocol, name)!r}")

    def is_num(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not is_num(protocol.temperature) or not 0 <= protocol.temperature < float("inf"):
        raise bad("temperature", ">= 0 and finite")
    if not is_num(protocol.top_p) or not 0 < protocol.top_p <= 1:
        raise bad("top_p", "in (0, 1]")
    if not is_int(protocol.top_k) or not (protocol.top_k == -1 or protocol.top_k >= 1):
        raise bad("top_k", "-1 (off) or >= 1")
    if not is_int(protocol.n_samples) or protocol.n_samples < 1:
        raise bad("n_samples", "an integer >= 1")
    if not is_int(protocol.max_new_tokens) or protocol.max_new_tokens < 1:
        raise bad("max_new_tokens", "an integer >= 1")
    if not isinstance(protocol.greedy_pass, bool):
        raise bad("greedy_pass", "true or false")


def check_kind(protocol: Protocol, kind: str, benchmark: str, default_protocol: str = "") -> None:
    """A protocol meant for math must not prompt a code benchmark, and vice versa.

    Raises:
        UserError: ``protocol 'qwen3-think' is for math benchmarks; 'lcb_v5' is a code benchmark (its
            default protocol: qwen3-think-pure)``.
    """
    if protocol.kind not in ("any", kind):
        hint = f" (its default protocol: {default_protocol})" if default_protocol else ""
        raise UserError(f"protocol '{protocol.name}' is for {protocol.kind} benchmarks; '{benchmark}' is a "
                        f"{kind} benchmark{hint}")


def missing_marker(protocol: Protocol, vocab: Any) -> str | None:
    """The first chat marker of ``protocol``'s fixed template (:data:`TEMPLATE_MARKERS`) that is not a token of
    ``vocab`` (a set or mapping of token strings), or None (also for protocols that use the model's own template)."""
    if protocol.template is None:
        return None
    return next((m for m in TEMPLATE_MARKERS if m in protocol.template and m not in vocab), None)


def check_tokenizer(protocol: Protocol, tokenizer: Any) -> None:
    """A fixed template's chat markers (:data:`TEMPLATE_MARKERS`) must each be one token of the model's
    tokenizer (otherwise the model reads them as plain text: R1 markers given to a Qwen tokenizer, or any
    fixed template given to the tiny model, which has no ``<think>``).

    Raises:
        UserError: names the marker and suggests ``--protocol chat-template``.
    """
    if protocol.template is None:
        return
    marker = missing_marker(protocol, tokenizer.get_vocab())
    if marker is not None:
        name = getattr(tokenizer, "name_or_path", "") or "tokenizer"
        raise UserError(f"protocol '{protocol.name}' uses {marker}, which is not a token of {name}; "
                        f"use a protocol for this model family (e.g. --protocol chat-template)")


def render_prompt(protocol: Protocol, problem_text: str, tokenizer: Any = None, kind: str | None = None) -> str:
    """The prompt string for one problem.

    Fixed template: ``template`` with ``{input}`` = the problem text (``.strip()``-ed when
    ``strip_input``), then ``.strip(" ")`` as AReaL's ``construct_prompt``. Chat template: the tokenizer's
    template around :func:`areal_cli.eval.prompts.user_message` for ``kind`` (default: the protocol's
    kind, math for "any").

    Raises:
        UserError: chat-template protocol without a tokenizer, or a tokenizer without a chat template.
    """
    if protocol.template is None:
        from areal_cli.eval.prompts import prompt_text

        if tokenizer is None:
            raise UserError(f"protocol '{protocol.name}' needs the model's tokenizer (chat template)")
        use_kind = kind or (protocol.kind if protocol.kind != "any" else "math")
        return prompt_text(tokenizer, problem_text, use_kind)
    text = problem_text.strip() if protocol.strip_input else problem_text
    return protocol.template.replace("{input}", text, 1).strip(" ")


def prompt_token_ids(protocol: Protocol, tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt, with special tokens as the protocol says (see module docstring)."""
    from areal_cli.eval.prompts import tokenize_prompt

    return tokenize_prompt(tokenizer, text, add_special_tokens=protocol.add_special_tokens)
