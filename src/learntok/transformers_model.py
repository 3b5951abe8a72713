"""Hugging Face transformers integration (optional extra: `pip install 'learntok[transformers]'`).

Every exported byte-level learntok model (`learntok export`, `learntok.save_pretrained`) is also a transformers
model directory: config.json carries `model_type: "learntok"` and an `auto_map` to two one-line files beside it
(configuration_learntok.py, modeling_learntok.py) that import the classes below, and the directory holds a byte
tokenizer (tokenizer.json) and generation_config.json. So

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)   # learntok must be installed
    AutoTokenizer.from_pretrained(DIR)
    lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --tasks ...

load it (after `import learntok.transformers_model` the classes are also registered with the Auto classes, so in
that process trust_remote_code is not needed).

Ids are learntok's vocabulary: 0-255 the byte values, 256 BOS, 257 EOS (document separator), 258 PAD, 259
unused. The tokenizer maps text to exactly its UTF-8 bytes (id = byte value, a `tokenizers` byte-level model
without merges; it adds no BOS, the model supplies it).

The forward pass keeps transformers' layout (logits[:, t] predicts input_ids[:, t + 1]) with three choices
that make it score like learntok's own evaluation:
- context: a row that does not start with BOS is read with BOS in front (context only, its logits dropped),
  since every learntok sequence starts with one (lm_eval sends unprefixed requests);
- padding: each row's attended span (attention_mask) is run alone, so left and right padding are both exact;
- boundaries: deterministic. The uniform noise of position t is the t-th draw of a generator seeded with
  config `boundary_seed` (the stream `learntok generate --seed` uses for one prompt), 0.5 for models whose
  `eval_boundaries` is greedy (a_t = [p_t > 0.5]). So greedy `generate` gives the bytes `learntok generate
  --temperature 0` gives.
There is no KV cache: each generation step recomputes the whole prefix (`learntok generate` caches both levels
and is the fast path). The BPE-token baseline (--arch token) has no byte tokenizer and is not exported this way.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from learntok.errors import MissingDependency
from learntok.hf_files import IDS
from learntok.vocab import BOS, IGNORE, VOCAB_SIZE

try:
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        GenerationConfig,
        GenerationMixin,
        PretrainedConfig,
        PreTrainedModel,
    )
    from transformers.modeling_outputs import CausalLMOutput
except ImportError as e:
    raise MissingDependency("the transformers integration needs transformers: pip install "
                            "'learntok[transformers]'") from e

MODEL_TYPE = "learntok"


class LearntokConfig(PretrainedConfig):
    """The exported config.json as a transformers config: learntok's own sections (`model`, `boundary`,
    `seq_len`, `format`...) are kept as they are and read back by `learntok.pretrained.read_config`."""

    model_type = MODEL_TYPE

    def __init__(self, boundary_seed: int = 0, **kwargs) -> None:
        kwargs = {**IDS, **kwargs}
        if "seq_len" in kwargs:
            kwargs.setdefault("max_position_embeddings", kwargs["seq_len"])  # lm_eval's truncation length
        self.boundary_seed = boundary_seed
        super().__init__(**kwargs)


class LearntokForCausalLM(PreTrainedModel, GenerationMixin):
    """A learntok ByteLM behind transformers' causal-LM interface (see the module docstring)."""

    config_class = LearntokConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules: list[str] = []
    _supports_cache_class = False

    def __init__(self, config: LearntokConfig, model: torch.nn.Module | None = None) -> None:
        super().__init__(config)
        if model is None:  # an empty model of this shape (weights come from `from_pretrained`)
            from learntok.config import ModelConfig, boundary_from_dict, build
            from learntok.model import build_model

            model = build_model(build(ModelConfig, config.model, "config.model"),
                                boundary_from_dict(config.boundary, "config.boundary"))
        if getattr(model, "predicts_tokens", False):
            raise ValueError("the transformers interface is for byte-level models; the BPE baseline (--arch token) "
                             "predicts tokens")
        self.model = model
        self.post_init()

    def set_rate(self, rate: float | None) -> None:
        """Ask the learned policy for boundary rate `rate` (learntok's `ByteLM.set_rate`; calibrated when the model
        directory holds a rate_calibration.json)."""
        self.model.set_rate(rate)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # no KV cache: generate must not build one

    def _init_weights(self, module) -> None:
        """learntok initialises its own modules; transformers must not re-initialise loaded weights."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, dtype=None, torch_dtype=None,
                        device_map=None, **kwargs):
        """Load through learntok's strict loader (a run, checkpoint, exported directory or Hub id): the weights
        file keeps learntok's tensor names, so transformers' own loader is not used. `dtype`/`torch_dtype`
        ("auto" keeps float32) and a device_map naming one device are honoured; other loading options are
        ignored."""
        from learntok.pretrained import load

        loaded = load(pretrained_model_name_or_path)
        if config is None:
            config = LearntokConfig.from_pretrained(loaded.path) if (loaded.path / "config.json").exists() and \
                loaded.cfg is None else _config_for(loaded.model, loaded.seq_len)
        out = cls(config, model=loaded.model).eval()
        out.generation_config = generation_config()
        dtype = dtype if dtype is not None else torch_dtype
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        if isinstance(dtype, torch.dtype):
            out = out.to(dtype)
        if isinstance(device_map, (str, torch.device)) and str(device_map) != "auto":
            out = out.to(device_map)
        return out

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """Write the learntok export (which is also this transformers directory)."""
        from learntok.pretrained import save_pretrained

        out = save_pretrained(self.model, save_directory, seq_len=int(self.config.seq_len))
        cfg = json.loads((out / "config.json").read_text())
        cfg["boundary_seed"] = int(self.config.boundary_seed)  # the export writes the default (0)
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    def get_input_embeddings(self):
        return self.model.embed

    def _noise(self, length: int, device) -> torch.Tensor:
        from learntok.draw import evaluates_greedily, uniforms

        gen = torch.Generator().manual_seed(int(self.config.boundary_seed))
        return uniforms(length, evaluates_greedily(self.model), gen)[None].to(device)

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B,T,V) logits of rows of equal length, BOS prepended where a row lacks it (its output dropped)."""
        from learntok.generation import prescribed_flags

        lead = int(ids[0, 0]) != BOS
        if lead:
            ids = torch.cat([torch.full_like(ids[:, :1], BOS), ids], 1)
        noise = self._noise(ids.shape[1], ids.device).expand(ids.shape[0], -1)
        logits = self.model(ids, noise=noise, prescribed=prescribed_flags(self.model, ids)).logits
        return logits[:, 1:] if lead else logits

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, return_dict: bool | None = None, **kwargs) -> CausalLMOutput:
        """logits (B,T,V) float; with labels, the mean next-token cross-entropy (labels shifted inside, -100
        ignored) as transformers' causal LMs compute it."""
        B, T = input_ids.shape
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        starts = input_ids[:, 0] == BOS
        if bool(mask.all()) and (bool(starts.all()) or not bool(starts.any())):
            logits = self._logits(input_ids) if T else input_ids.new_zeros(B, 0, VOCAB_SIZE, dtype=torch.float)
        else:
            logits = None
            for b in range(B):
                where = mask[b].nonzero()[:, 0]
                if where.numel() == 0:
                    continue
                s, e = int(where[0]), int(where[-1]) + 1
                row = self._logits(input_ids[b:b + 1, s:e])
                if logits is None:
                    logits = row.new_zeros(B, T, row.shape[-1])
                logits[b, s:e] = row[0]
            if logits is None:
                logits = torch.zeros(B, T, VOCAB_SIZE, device=input_ids.device)
        logits = logits.float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=IGNORE)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """The whole prefix every step (no KV cache)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}


def _config_for(model, seq_len: int) -> LearntokConfig:
    """The transformers config of an in-memory model (what `save_pretrained` writes, as a config object)."""
    from learntok.pretrained import config_dict

    return LearntokConfig(**config_dict(model, seq_len))


def generation_config() -> GenerationConfig:
    """What generation_config.json holds: learntok's special ids, no cache, BOS/PAD/unused never sampled."""
    from learntok.hf_files import GENERATION

    return GenerationConfig(**GENERATION)


def wrap(model, seq_len: int) -> LearntokForCausalLM:
    """An in-memory ByteLM as a transformers model (shares its weights)."""
    out = LearntokForCausalLM(_config_for(model, seq_len), model=model)
    out.generation_config = generation_config()
    return out


def tokenizer(directory: str | Path | None = None):
    """The byte tokenizer as a transformers `PreTrainedTokenizerFast` (read from `directory` when given)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if directory is not None:
        return AutoTokenizer.from_pretrained(str(directory))
    from learntok.hf_files import byte_tokenizer, special_tokens

    return PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(), **special_tokens())


AutoConfig.register(MODEL_TYPE, LearntokConfig, exist_ok=True)
AutoModelForCausalLM.register(LearntokConfig, LearntokForCausalLM, exist_ok=True)
