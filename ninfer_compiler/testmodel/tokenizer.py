"""Tiny byte-level BPE tokenizers and chat templates for the test models.

The real tokenizers have ~150-250 k entries; the test models have 512 embedding rows. We train a
BPE on `corpus.txt` (shipped with the project, so training is reproducible offline) up to id 499
and put the media placeholders at the fixed ids of models.md section 9 (500..503 for Qwen,
500..505 for GLM). Ids 0..8 are the control tokens both flavours share; pad `<|endoftext|>` = 0 and
eos `<|im_end|>` = 1 match the model configs. Ids above the last media token have embedding rows
but no token, like the padded rows of the real vocabularies.

The pipeline mirrors the one `Qwen3_5Tokenizer` rebuilds (NFC, the Qwen split regex, byte-level
without its own regex), because `AutoTokenizer` always picks that class for qwen3_5 / qwen3_5_moe /
qwen4_exp model directories; matching it keeps the `tokenizers` library and transformers in
agreement. BPE training in `tokenizers` is deterministic, so the files are identical on every run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig
from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

from .configs import EOS_TOKEN_ID, PAD_TOKEN_ID, VOCAB_SIZE

PACKAGE_DIR = Path(__file__).resolve().parent
CORPUS_PATH = PACKAGE_DIR / "corpus.txt"

MEDIA_BASE_ID = 500  # first media placeholder id; the BPE fills the ids below it
MODEL_MAX_LENGTH = 4096

# (content, special). Special tokens are dropped by decode(skip_special_tokens=True); the think and
# tool markers are not, as in the Qwen3 tokenizers, so parsers can still see them.
_SHARED_CONTROL: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),  # 0: pad
    ("<|im_end|>", True),  # 1: eos
    ("<|im_start|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)


@dataclass(frozen=True)
class TokenizerFlavor:
    """Everything that differs between the Qwen and GLM tokenizers of the test models."""

    name: str
    control_tokens: tuple[tuple[str, bool], ...]  # ids 0.. in order
    media_tokens: tuple[str, ...]  # ids MEDIA_BASE_ID.. in order
    stop_tokens: tuple[str, ...]  # generation_config eos ids, first = config eos
    template_file: str
    tokenizer_class: str

    def token_ids(self) -> dict[str, int]:
        """Fixed ids of the control and media tokens."""
        ids = {content: i for i, (content, _) in enumerate(self.control_tokens)}
        ids.update({content: MEDIA_BASE_ID + i for i, content in enumerate(self.media_tokens)})
        return ids

    def chat_template(self) -> str:
        return (PACKAGE_DIR / self.template_file).read_text(encoding="utf-8")


QWEN = TokenizerFlavor(
    name="qwen",
    control_tokens=_SHARED_CONTROL,
    media_tokens=("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"),
    stop_tokens=("<|im_end|>",),
    template_file="chat_template.jinja",
    tokenizer_class="Qwen3_5Tokenizer",
)

GLM = TokenizerFlavor(
    name="glm",
    control_tokens=_SHARED_CONTROL
    + tuple(
        (t, True)
        for t in ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
    ),
    media_tokens=(
        "<|image|>",
        "<|video|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
    ),
    # GLM turns have no end token: generation stops at the next role marker.
    stop_tokens=("<|im_end|>", "<|user|>", "<|observation|>"),
    template_file="chat_template_glm.jinja",
    tokenizer_class="TokenizersBackend",
)

_FLAVOR_OF_ARCH = {"qwen3_5": QWEN, "qwen3_5_moe": QWEN, "qwen4_exp": QWEN, "glm5_next": GLM}


def flavor_for(arch: str) -> TokenizerFlavor:
    """The tokenizer flavour of a test-model architecture."""
    if arch not in _FLAVOR_OF_ARCH:
        raise ValueError(f"unknown test-model architecture {arch!r}")
    return _FLAVOR_OF_ARCH[arch]


def _corpus_documents() -> list[str]:
    # Sections, not lines, so newline runs and indentation are learned as well.
    return CORPUS_PATH.read_text(encoding="utf-8").split("\n---\n")


def train_tokenizer(flavor: TokenizerFlavor) -> Tokenizer:
    """Train the BPE of `flavor` on the bundled corpus (deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MEDIA_BASE_ID,
        special_tokens=[content for content, _ in flavor.control_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_documents(), trainer=trainer)
    if tok.get_vocab_size() != MEDIA_BASE_ID:
        raise RuntimeError(
            f"BPE training produced {tok.get_vocab_size()} entries, expected {MEDIA_BASE_ID}; "
            "the corpus is too small for the requested merges"
        )
    tok.add_special_tokens(list(flavor.media_tokens))
    # The trainer registers every reserved token as special; restore the intended flags.
    data = json.loads(tok.to_str())
    special = dict(flavor.control_tokens) | dict.fromkeys(flavor.media_tokens, True)
    for entry in data["added_tokens"]:
        entry["special"] = special[entry["content"]]
    tok = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    _check_ids(tok, flavor)
    return tok


def _check_ids(tok: Tokenizer, flavor: TokenizerFlavor) -> None:
    for content, expected in flavor.token_ids().items():
        if tok.token_to_id(content) != expected:
            raise RuntimeError(f"{content} got id {tok.token_to_id(content)}, expected {expected}")
    if tok.get_vocab_size() > VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids, model rows {VOCAB_SIZE}")


def tokenizer_config(flavor: TokenizerFlavor) -> dict[str, Any]:
    """Contents of tokenizer_config.json (the chat template lives in chat_template.jinja)."""
    return {
        "add_prefix_space": False,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": flavor.control_tokens[EOS_TOKEN_ID][0],
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": flavor.control_tokens[PAD_TOKEN_ID][0],
        "split_special_tokens": False,
        "tokenizer_class": flavor.tokenizer_class,
        "unk_token": None,
    }


def generation_config(flavor: TokenizerFlavor) -> GenerationConfig:
    """Stop and pad ids for generation_config.json."""
    ids = flavor.token_ids()
    stops = [ids[t] for t in flavor.stop_tokens]
    return GenerationConfig(
        eos_token_id=stops[0] if len(stops) == 1 else stops, pad_token_id=PAD_TOKEN_ID
    )


def save_tokenizer(out_dir: Path, flavor: TokenizerFlavor) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_tokenizer(flavor).save(str(out_dir / "tokenizer.json"), pretty=True)
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(flavor))
    (out_dir / "chat_template.jinja").write_text(flavor.chat_template(), encoding="utf-8")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(
        json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML and sorts keys; chat templates expect plain json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """Render a chat template with plain jinja2, set up the way transformers sets it up.

    This is the reference a runtime without transformers must reproduce; tests check that it
    equals `tokenizer.apply_chat_template(..., tokenize=False)`.
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
