"""Text side of the runtime: tokenizer, chat template rendering, streaming detokenizer, stop
strings, and the reasoning (`<think>`) and Qwen tool-call parsers."""

from .chat_template import ChatTemplate, ChatTemplateError
from .detokenizer import StreamingDetokenizer
from .reasoning import ReasoningSplitter, split_reasoning
from .stop import StopMatcher
from .tokenizer import Tokenizer, TokenizerError
from .tool_calls import (
    ParsedOutput,
    StreamingToolCallParser,
    ToolCall,
    ToolCallUpdate,
    new_call_id,
    parse_tool_calls,
    render_tool_call,
)

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "ParsedOutput",
    "ReasoningSplitter",
    "StopMatcher",
    "StreamingDetokenizer",
    "StreamingToolCallParser",
    "Tokenizer",
    "TokenizerError",
    "ToolCall",
    "ToolCallUpdate",
    "new_call_id",
    "parse_tool_calls",
    "render_tool_call",
    "split_reasoning",
]
