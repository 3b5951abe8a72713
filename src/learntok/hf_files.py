"""The files that make an exported learntok directory a transformers model directory too, written without
transformers installed (only `tokenizers`, a base dependency): config keys, a byte tokenizer, a generation config
and the one-line module that `auto_map` names. learntok.transformers_model reads them."""

from __future__ import annotations

import json
from pathlib import Path

from learntok.vocab import BOS, EOS, PAD, VOCAB_SIZE

SPECIAL = {"bos_token": "<|learntok_bos|>", "eos_token": "<|learntok_eos|>", "pad_token": "<|learntok_pad|>"}
"""Special-token strings for ids 256-258 (text containing one of them exactly is read as that token, as in
every Hugging Face tokenizer; the names are chosen not to occur in ordinary text). Id 259 is unused."""
UNUSED = "<|learntok_unused|>"
MODULE = "modeling_learntok"
IDS = {"vocab_size": VOCAB_SIZE, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
"""learntok's vocabulary in transformers' config names (config.json, LearntokConfig's defaults)."""
GENERATION = {**{k: v for k, v in IDS.items() if k != "vocab_size"}, "use_cache": False,
              "suppress_tokens": [BOS, PAD, VOCAB_SIZE - 1]}
"""generation_config.json: no KV cache; BOS, PAD and the unused id are never sampled (as `learntok generate`)."""
MODULE_TEXT = ('"""transformers loads learntok models through this file (auto_map in config.json); learntok must be '
               'installed."""\n\nfrom learntok.transformers_model import LearntokConfig, LearntokForCausalLM  '
               '# noqa: F401\n')


def config_keys(seq_len: int) -> dict:
    """The keys transformers reads from config.json (AutoConfig, lm_eval's maximum length)."""
    return {"model_type": "learntok", "architectures": ["LearntokForCausalLM"],
            "auto_map": {"AutoConfig": f"{MODULE}.LearntokConfig",
                         "AutoModelForCausalLM": f"{MODULE}.LearntokForCausalLM"},
            **IDS, "max_position_embeddings": seq_len, "boundary_seed": 0}


def byte_alphabet() -> list[str]:
    """The printable stand-in character of each byte value (GPT-2's byte-to-unicode table, which `tokenizers`'
    ByteLevel pre-tokenizer and decoder use): byte b is the token string byte_alphabet()[b]."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def special_tokens() -> dict[str, str]:
    return dict(SPECIAL)


def byte_tokenizer():
    """A `tokenizers.Tokenizer` with id = byte value for every byte and BOS/EOS/PAD at 256-258. It adds no BOS
    (the model reads a row without one as if it had one, so text encodes to exactly its bytes, as lm_eval and
    `generate` expect); decoding maps ids back to bytes (invalid UTF-8 decodes as U+FFFD)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: b for b, c in enumerate(byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in (*SPECIAL.values(), UNUSED)])
    assert [tok.token_to_id(s) for s in (*SPECIAL.values(), UNUSED)] == [BOS, EOS, PAD, VOCAB_SIZE - 1]
    return tok


def write(out: Path, seq_len: int) -> None:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json and the
    auto_map module into `out` (config.json's keys come from `config_keys`)."""
    byte_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIAL, "model_max_length": seq_len,
         "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(SPECIAL, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(GENERATION, indent=2) + "\n")
    (out / f"{MODULE}.py").write_text(MODULE_TEXT)
