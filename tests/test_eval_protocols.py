"""Claims: the named protocols carry AReaL v0.3's prompt strings verbatim (qwen3-think for math,
qwen3-think-pure for code, r1-distilled-qwen / -pure) and render prompts exactly as AReaL's
construct_prompt does; each has its published sampling preset (DeepSeek-R1: 64 samples, T=0.6, top_p=0.95;
greedy; the chat-template default); explicit options override single settings and are recorded; unknown
names, bad values, a protocol of the wrong kind and a template the tokenizer cannot read are one-line
UserErrors."""

from __future__ import annotations

import copy
import json

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.eval.protocols import (
    PROTOCOLS,
    apply_overrides,
    check_kind,
    check_tokenizer,
    get_protocol,
    prompt_token_ids,
    render_prompt,
)

# inclusionAI/AReaL v0.3.0 evaluation/utils.py PROMPT_TEMPLATES[name][0], copied as written there
# (Python str.format templates: "{{}}" is a literal "{}").
AREAL_UPSTREAM = {
    "qwen3-think": (
        "<|im_start|>user\n{input}\nPlease reason step by step, and put your final answer within \\boxed{{}}./think<|im_end|>\n"
        "<|im_start|>assistant\n<think>"
    ),
    "qwen3-think-pure": (
        "<|im_start|>user\n{input}\n/think<|im_end|>\n"
        "<|im_start|>assistant\n<think>"
    ),
    "r1-distill": (
        "<｜User｜>{input}\nPlease reason step by step, and put your final answer within \\boxed{{}}.<｜Assistant｜><think>\n"
    ),
    "r1-distill-pure": "<｜User｜>{input}<｜Assistant｜><think>\n",
}


def areal_construct_prompt(name: str, question: str) -> str:
    """What AReaL's construct_prompt returns for a zero-shot question (utils.py: format, then strip(" "))."""
    return AREAL_UPSTREAM[name].format(input=question).strip(" ")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from areal_cli.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)))


def test_templates_are_areals_strings_verbatim():
    for name, upstream in AREAL_UPSTREAM.items():
        assert PROTOCOLS[name].template == upstream.format(input="{input}"), name
    assert "\\boxed{}./think<|im_end|>" in PROTOCOLS["qwen3-think"].template


def test_rendered_prompts_equal_areals_construct_prompt():
    # math_eval.py strips the question (Qwen2.5-Math parse_question); code_eval.py inserts it as stored
    question = "  Find $\\{x\\}$ with {braces}, $x^{2}$.\n"
    for name in ("qwen3-think", "r1-distill"):
        assert render_prompt(PROTOCOLS[name], question) == areal_construct_prompt(name, question.strip())
    code_question = "### Question:\nPrint {1}.\n\n### Answer: (use the provided format with backticks)\n\n"
    for name in ("qwen3-think-pure", "r1-distill-pure"):
        assert render_prompt(PROTOCOLS[name], code_question) == areal_construct_prompt(name, code_question)
    assert render_prompt(PROTOCOLS["qwen3-think-pure"], "Q") == (
        "<|im_start|>user\nQ\n/think<|im_end|>\n<|im_start|>assistant\n<think>")


def test_sampling_presets():
    def preset(name):
        p = PROTOCOLS[name]
        return (p.kind, p.temperature, p.top_p, p.top_k, p.n_samples, p.max_new_tokens, p.greedy_pass)

    assert preset("qwen3-think") == ("math", 1.0, 0.95, -1, 32, 32768, True)
    assert preset("qwen3-think-pure") == ("code", 1.0, 0.95, -1, 8, 32768, True)
    assert preset("r1-distill") == ("math", 0.6, 0.95, -1, 64, 32768, False)
    assert preset("r1-distill-pure") == ("code", 0.6, 0.95, -1, 64, 32768, False)
    assert preset("greedy") == ("any", 0.0, 1.0, -1, 1, 512, False)
    assert preset("chat-template") == ("any", 0.6, 0.95, -1, 1, 512, False)
    for name in ("qwen3-think", "qwen3-think-pure", "r1-distill", "r1-distill-pure"):
        assert PROTOCOLS[name].stop == ("</s>", "<|im_end|>", "<|endoftext|>"), name  # code_eval: no "\n\n\n"
        assert PROTOCOLS[name].add_special_tokens, name  # vLLM tokenises the text with special tokens
    assert PROTOCOLS["chat-template"].template is None and not PROTOCOLS["chat-template"].add_special_tokens


def test_unknown_protocol_lists_the_known_ones():
    with pytest.raises(UserError) as info:
        get_protocol("qwen3")
    assert str(info.value) == ("unknown protocol 'qwen3'; known protocols: qwen3-think, qwen3-think-pure, "
                               "r1-distill, r1-distill-pure, greedy, chat-template")
    assert get_protocol("r1-distill") is PROTOCOLS["r1-distill"]


def test_explicit_options_override_the_preset_and_are_recorded():
    base = get_protocol("r1-distill")
    p = apply_overrides(base, temperature=1.0, n_samples=8, top_p=None, max_new_tokens=32768)
    assert (p.temperature, p.n_samples, p.top_p, p.max_new_tokens) == (1.0, 8, 0.95, 32768)
    assert p.overrides == ("temperature", "n_samples")  # an option equal to the preset is no override
    assert p.template == base.template and base.overrides == ()
    record = json.loads(json.dumps(p.to_dict()))
    assert record["name"] == "r1-distill" and record["overrides"] == ["temperature", "n_samples"]
    assert record["stop"] == ["</s>", "<|im_end|>", "<|endoftext|>"] and record["prompt"] == "fixed_string"
    assert record["template"] == base.template and record["n_samples"] == 8
    assert apply_overrides(p, greedy_pass=True).overrides == ("temperature", "n_samples", "greedy_pass")


@pytest.mark.parametrize("options, message", [
    (dict(temperature=-0.1), "option 'temperature': must be >= 0 and finite, got -0.1"),
    (dict(top_p=0), "option 'top_p': must be in (0, 1], got 0"),
    (dict(top_p=1.5), "option 'top_p': must be in (0, 1], got 1.5"),
    (dict(top_k=0), "option 'top_k': must be -1 (off) or >= 1, got 0"),
    (dict(n_samples=0), "option 'n_samples': must be an integer >= 1, got 0"),
    (dict(max_new_tokens=2.5), "option 'max_new_tokens': must be an integer >= 1, got 2.5"),
    (dict(greedy_pass="yes"), "option 'greedy_pass': must be true or false, got 'yes'"),
    (dict(seed=1), "option 'seed' is not a protocol setting (settings: temperature, top_p, top_k, n_samples, "
                   "max_new_tokens, greedy_pass)"),
])
def test_bad_override_is_a_one_line_user_error(options, message):
    with pytest.raises(UserError) as info:
        apply_overrides(get_protocol("qwen3-think"), **options)
    assert str(info.value) == message


def test_protocol_kind_must_match_the_benchmark():
    check_kind(get_protocol("qwen3-think"), "math", "aime24")
    check_kind(get_protocol("chat-template"), "code", "lcb_v5")
    with pytest.raises(UserError) as info:
        check_kind(get_protocol("qwen3-think"), "code", "lcb_v5", "qwen3-think-pure")
    assert str(info.value) == ("protocol 'qwen3-think' is for math benchmarks; 'lcb_v5' is a code benchmark "
                               "(its default protocol: qwen3-think-pure)")


def test_fixed_template_needs_its_markers_as_tokens(tokenizer):
    check_tokenizer(get_protocol("chat-template"), tokenizer)
    with pytest.raises(UserError, match="protocol 'r1-distill' uses <｜User｜>, which is not a token of"):
        check_tokenizer(get_protocol("r1-distill"), tokenizer)
    # the tiny tokenizer knows <|im_start|> / <|im_end|> but not Qwen3's <think>
    with pytest.raises(UserError, match=r"protocol 'qwen3-think' uses <think>, .*--protocol chat-template"):
        check_tokenizer(get_protocol("qwen3-think"), tokenizer)
    with_think = copy.deepcopy(tokenizer)
    with_think.add_special_tokens({"additional_special_tokens": ["<think>"]})
    check_tokenizer(get_protocol("qwen3-think"), with_think)


def test_chat_template_protocols_use_the_model_template(tokenizer):
    from areal_cli.eval.prompts import prompt_text

    for name in ("chat-template", "greedy"):
        p = get_protocol(name)
        assert render_prompt(p, "What is $1+1$?", tokenizer) == prompt_text(tokenizer, "What is $1+1$?")
        code = "### Question:\nPrint 1.\n\n"
        assert render_prompt(p, code, tokenizer, kind="code") == (
            f"<|im_start|>user\n{code}<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(UserError, match="protocol 'greedy' needs the model's tokenizer"):
        render_prompt(get_protocol("greedy"), "x")


def test_token_ids_follow_the_protocols_special_token_setting(tokenizer):
    seen = []

    class RecordingTokenizer:
        def __call__(self, text, add_special_tokens):
            seen.append(add_special_tokens)
            return tokenizer(text, add_special_tokens=add_special_tokens)

    text = render_prompt(get_protocol("qwen3-think"), "1+1?")
    ids = prompt_token_ids(get_protocol("qwen3-think"), RecordingTokenizer(), text)
    chat = render_prompt(get_protocol("chat-template"), "1+1?", tokenizer)
    prompt_token_ids(get_protocol("chat-template"), RecordingTokenizer(), chat)
    assert seen == [True, False]
    assert tokenizer.decode(ids) == text and ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_the_default_protocol_follows_the_models_tokens_and_a_refusal_comes_first():
    from areal_cli.eval.benchmarks import load_benchmark_specs
    from areal_cli.eval.settings import choose_protocol

    specs = load_benchmark_specs()
    qwen3 = {"<|im_start|>", "<|im_end|>", "<think>", "</think>"}
    chatml_only = {"<|im_start|>", "<|im_end|>"}  # SmolLM2: ChatML, no <think>
    assert choose_protocol(None, specs, ["math_500"], False, vocab=qwen3) == "qwen3-think"
    notes: list[str] = []
    assert choose_protocol(None, specs, ["math_500"], False, vocab=chatml_only, model="smol.gguf",
                           notes=notes) == "chat-template"
    assert notes == ["protocol: chat-template, the model's own chat template and its sampling settings (the "
                     "benchmarks' default 'qwen3-think' uses <think>, which is not a token of smol.gguf; --protocol "
                     "NAME chooses another)"]
    with pytest.raises(UserError, match=r"^protocol 'r1-distill' uses <｜User｜>, which is not a token of smol.gguf; "):
        choose_protocol("r1-distill", specs, ["math_500"], False, vocab=chatml_only, model="smol.gguf")
    assert choose_protocol("chat-template", specs, ["math_500"], False, vocab=set()) == "chat-template"
    assert choose_protocol(None, specs, ["math_500"], False) == "qwen3-think"  # no vocabulary: as declared


def test_a_gguf_files_tokens_are_read_without_converting_it(tmp_path):
    from areal_cli.models.gguf import tokens

    with pytest.raises(UserError, match="file not found"):
        tokens(tmp_path / "none.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"not gguf at all")
    with pytest.raises(UserError, match="not a readable GGUF file"):
        tokens(tmp_path / "bad.gguf")
