"""Reference token ids from vLLM 0.32's own code, run in the vLLM venv by tests/test_tokenize.py.

Reads JSON from stdin: ``{"model_dir", "chats": [{"messages", "add_generation_prompt"}],
"texts": [str]}``. Chats go through vLLM's message parsing (``parse_chat_messages`` with the
content format vLLM resolves) and ``safe_apply_chat_template`` (tokenize=True, as the chat
endpoint calls it); texts through the tokenizer with ``add_special_tokens=True`` (the
completions default). Writes ``{"chats": [[ids]], "texts": [[ids]]}`` to stdout.
"""

import json
import sys

from transformers import AutoTokenizer  # type: ignore[import-not-found]
from vllm.config import ModelConfig  # type: ignore[import-not-found]
from vllm.renderers.chat_utils import parse_chat_messages  # type: ignore[import-not-found]
from vllm.renderers.hf import (  # type: ignore[import-not-found]
    resolve_chat_template_content_format,
    safe_apply_chat_template,
)

request = json.load(sys.stdin)
model_dir = request["model_dir"]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
config = ModelConfig(model=model_dir, tokenizer=model_dir, dtype="float32", max_model_len=4096)
content_format = resolve_chat_template_content_format(
    chat_template=None, tools=None, given_format="auto", tokenizer=tokenizer, model_config=config
)
chats = []
for chat in request["chats"]:
    conversation, _, _ = parse_chat_messages(chat["messages"], config, content_format)
    ids = safe_apply_chat_template(
        config,
        tokenizer,
        conversation,
        add_generation_prompt=chat["add_generation_prompt"],
        continue_final_message=False,
    )
    chats.append(list(ids))
texts = [tokenizer(text, add_special_tokens=True)["input_ids"] for text in request["texts"]]
json.dump({"chats": chats, "texts": texts}, sys.stdout)
