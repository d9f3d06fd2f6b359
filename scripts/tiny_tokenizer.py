"""The tiny model's tokenizer files without transformers or torch: for tests and benchmarks.

``scripts/make_tiny_model.py`` (run in the vLLM venv) writes the real tiny model. Where it
is missing, :func:`tiny_tokenizer_dir` builds the same kind of tokenizer with the
``tokenizers`` library alone: a byte-level BPE of 2048 tokens trained on the same generated
corpus, the same special tokens and chat template. Its merges may differ from the real
model's in detail (transformers' wrapper is not involved), so exactness against vLLM is only
ever tested on the real directory. About a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
from pathlib import Path
from types import ModuleType

REAL_MODEL_DIR = Path(
    os.environ.get("LONGROUTE_VLLM_MODEL")
    or Path.home() / ".cache" / "longroute" / "models" / "tiny-llama-v1"
)


def _make_tiny_model() -> ModuleType:
    path = Path(__file__).with_name("make_tiny_model.py")
    spec = importlib.util.spec_from_file_location("make_tiny_model", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_tokenizer_dir(out: Path, seed: int = 0) -> Path:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tiny = _make_tiny_model()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tiny.VOCAB_SIZE,
        special_tokens=[tiny.BOS, tiny.EOS, tiny.PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tiny.corpus(random.Random(seed)), trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"bos_token": tiny.BOS, "eos_token": tiny.EOS, "pad_token": tiny.PAD}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(tiny.CHAT_TEMPLATE)
    return out


def tiny_tokenizer_dir(scratch: Path) -> tuple[Path, bool]:
    """The real tiny model's directory if present, else one built in ``scratch``; is_real."""
    if (REAL_MODEL_DIR / "tokenizer.json").is_file():
        return REAL_MODEL_DIR, True
    return build_tokenizer_dir(scratch / "tiny-tokenizer"), False
