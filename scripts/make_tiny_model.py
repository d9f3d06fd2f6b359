"""Create a tiny random-weight Llama and a locally trained tokenizer that vLLM can serve.

No model can be downloaded here, so tests/test_real_engine.py runs vLLM on this one:
2 layers, hidden 256, 4 attention heads, 2 KV heads, head_dim 64, 4096 positions, weights
drawn from a fixed seed. Its tokenizer is a byte-level BPE trained on a small generated
corpus: the 256 byte symbols are ordinary vocabulary entries, so any text encodes (nothing
is ever unknown) and decodes back exactly. It is saved as a ``PreTrainedTokenizerFast``
with bos/eos tokens and a Jinja chat template, so vLLM's chat endpoint works.

Runs in the engine's environment (it needs torch, transformers and tokenizers, which the
vLLM install brings), called by scripts/setup_vllm_cpu.sh::

    python scripts/make_tiny_model.py --out DIR [--seed 0]

Deterministic: the same seed gives the same corpus, tokenizer and weights.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
VOCAB_SIZE = 2048
NUM_CORPUS_LINES = 4000

# role headers as plain text: the BPE learns them, no special tokens needed
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

WORD_TEXT = (
    "the a an of to and in is that it for on with as was at by be this from or which "
    "model engine request token cache prefix block router gateway fleet region latency "
    "queue batch prompt answer question system user assistant document section page "
    "long short context memory server client stream first last time second minute "
    "policy route load balance health metric count value number rate error retry "
    "why how what when where who please explain summarize describe compare list "
    "data result report table figure chapter paragraph sentence word letter "
    "one two three four five six seven eight nine ten hundred thousand"
)
WORDS = WORD_TEXT.split()


def corpus(rng: random.Random) -> list[str]:
    """Generated training text: word salad, chat headers, digits and punctuation."""
    lines = []
    for i in range(NUM_CORPUS_LINES):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 25))]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ","])
        role = ("system", "user", "assistant")[i % 3]
        lines.append(f"<|{role}|>\n{sentence} {rng.randint(0, 9999)}")
    return lines


def build_tokenizer(seed: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes stay in vocab
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(random.Random(seed)), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.model_max_length = 4096
    return wrapped


def build_model(tokenizer, seed: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def check(out: Path) -> None:
    """Reload what was saved: any text round-trips, the template renders, a forward pass runs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "Prefix caches, Ünïcödé, 中文, emoji 🚀 and bytes \x01\x7f."
    ids = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.decode(ids) != text:
        raise SystemExit(f"tokenizer does not round-trip {text!r}: {tokenizer.decode(ids)!r}")
    messages = [{"role": "user", "content": "hello"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not (prompt.startswith(BOS) and prompt.endswith("<|assistant|>\n")):
        raise SystemExit(f"unexpected chat template output: {prompt!r}")
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    if tuple(logits.shape) != (1, len(ids), len(tokenizer)):
        raise SystemExit(f"unexpected logits shape {tuple(logits.shape)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of corpus and weights")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.seed)
    tokenizer.save_pretrained(args.out)
    model = build_model(tokenizer, args.seed)
    model.save_pretrained(args.out, safe_serialization=True)
    check(args.out)
    num_params = sum(p.numel() for p in model.parameters())
    print(
        f"tiny model in {args.out}: vocab {len(tokenizer)}, {num_params / 1e6:.2f} M parameters",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
