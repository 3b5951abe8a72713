"""The transformers integration with the real library, offline: an exported directory loads through
AutoConfig / AutoModelForCausalLM / AutoTokenizer, scores like learntok's own forward pass, generates the bytes
`learntok generate` gives, and `lm_eval --model hf` (lm-eval's own command line) evaluates it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'learntok[transformers]')")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from learntok.generation import generate  # noqa: E402
from learntok.pretrained import save_pretrained  # noqa: E402
from learntok.transformers_model import LearntokForCausalLM, wrap  # noqa: E402
from learntok.vocab import BOS, EOS  # noqa: E402

from .conftest import build_model  # noqa: E402

TEXTS = ["héllo wörld", "日本語のテキスト", "emoji 😀👍🏽 and e\u0301 (combining)", "plain ascii", ""]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = build_model("learned").eval()
    out = save_pretrained(model, tmp_path_factory.mktemp("hf") / "model", seq_len=64)
    return model, out


def test_auto_classes_load_an_exported_directory(exported):
    model, path = exported
    cfg = AutoConfig.from_pretrained(path, trust_remote_code=True)
    assert cfg.model_type == "learntok" and cfg.max_position_embeddings == 64
    hf = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    assert isinstance(hf, LearntokForCausalLM)
    ids = torch.tensor([[BOS, *b"def f(x):"]])
    noise = torch.rand(1, ids.shape[1], generator=torch.Generator().manual_seed(0))
    ref = model(ids, noise=noise).logits
    assert torch.allclose(hf(ids).logits, ref, atol=1e-5)


def test_the_wrappers_save_keeps_its_boundary_seed(exported, tmp_path):
    """save_pretrained wrote the export's default boundary_seed 0 over the wrapper's own."""
    _, path = exported
    hf = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    hf.config.boundary_seed = 7
    ids = torch.tensor([[BOS, *b"the cat sat on the mat"]])
    hf.save_pretrained(tmp_path / "again")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again", trust_remote_code=True)
    assert again.config.boundary_seed == 7 and torch.equal(again(ids).logits, hf(ids).logits)


def test_set_rate_through_the_wrapper_asks_the_learned_policy(exported):
    model, path = exported
    hf = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    ids = torch.tensor([[BOS, *b"def f(x): return x + 1 if x else None"]])
    noise = torch.rand(1, ids.shape[1], generator=torch.Generator().manual_seed(0))
    plain = hf(ids).logits
    hf.set_rate(0.6)
    own = build_model("learned").eval()
    own.load_state_dict(model.state_dict())
    own.set_rate(0.6)
    ref = own(ids, noise=noise)
    assert torch.allclose(hf(ids).logits, ref.logits, atol=1e-5) and not torch.allclose(plain, ref.logits)


def test_tokenizer_ids_are_bytes_and_round_trip(exported):
    tok = AutoTokenizer.from_pretrained(exported[1])
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == list(text.encode()) == tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert tok.decode([BOS, *ids, EOS], skip_special_tokens=True) == text
    assert tok.eos_token_id == EOS and tok.pad_token_id == 258 and len(tok) == 260
    batch = tok(["a", "abc"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 3) and batch["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]


def test_forward_adds_bos_and_is_exact_under_padding(exported):
    """A row without BOS is read with one in front; left and right padding leave every real position's logits
    as they are alone; labels give transformers' shifted cross-entropy."""
    hf = wrap(exported[0], 64)
    text = list(b"the cat sat")
    full = hf(torch.tensor([[BOS, *text]])).logits
    assert torch.allclose(hf(torch.tensor([text])).logits, full[:, 1:], atol=1e-5)
    short = list(b"dog")
    ids = torch.tensor([[BOS, *text], [258] * (len(text) - len(short)) + [BOS, *short]])
    mask = (ids != 258).long()
    out = hf(ids, attention_mask=mask).logits
    assert torch.allclose(out[0], full[0], atol=1e-5)
    assert torch.allclose(out[1, -4:], hf(torch.tensor([[BOS, *short]])).logits[0], atol=1e-5)
    right = torch.tensor([[BOS, *short] + [258] * (len(text) - len(short))])
    assert torch.allclose(hf(right, attention_mask=(right != 258).long()).logits[0, :4], out[1, -4:], atol=1e-5)
    labels = torch.tensor([[BOS, *text]])
    loss = hf(labels, labels=labels).loss
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(full[0, :-1], labels[0, 1:]).item(),
                                        rel=1e-5)


@pytest.mark.parametrize("boundaries", ["sample", "greedy"])
def test_greedy_generate_matches_learntok_generate(tmp_path, boundaries):
    model = build_model("learned", eval_boundaries=boundaries).eval()
    path = save_pretrained(model, tmp_path / "m", seq_len=64)
    hf = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(path)
    for prompt in ("The ", "x = 1\n"):
        ref = generate(model, [prompt], 24, temperature=0, seed=0)[0]
        out = hf.generate(**tok(prompt, return_tensors="pt"), max_new_tokens=24, do_sample=False)[0]
        new = out.tolist()[len(prompt.encode()):]
        assert bytes(new[:len(ref)]) == ref
        assert len(new) == len(ref) or new[len(ref)] == EOS


def test_token_baseline_is_refused():
    model = build_model("learned")
    model.predicts_tokens = True
    with pytest.raises(ValueError, match="byte-level"):
        wrap(model, 64)


def _task(path, name: str, kind: str, data) -> None:
    rows = path / f"{name}.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in data))
    head = (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  cache_dir: {path / 'hf'}\n"
            f"  data_files:\n    test: {rows}\ntest_split: test\noutput_type: {kind}\n")
    body = {"multiple_choice": "doc_to_text: '{{query}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{gold}}'\n"
                               "metric_list:\n  - metric: acc\n",
            "loglikelihood_rolling": "doc_to_text: ''\ndoc_to_target: '{{text}}'\n"
                                     "metric_list:\n  - metric: bits_per_byte\n",
            "generate_until": "doc_to_text: '{{query}}'\ndoc_to_target: '{{answer}}'\ngeneration_kwargs:\n"
                              "  until: ['\\n']\n  max_gen_toks: 12\n  do_sample: false\n"
                              "metric_list:\n  - metric: exact_match\n"}[kind]
    (path / f"{name}.yaml").write_text(head + body)


@pytest.mark.integration
def test_lm_eval_command_line_with_model_hf(exported, tmp_path):
    """lm-eval's own CLI, `--model hf`, on local YAML tasks with loglikelihood, rolling and generation requests;
    each number checked against the transformers model in this process."""
    model, path = exported
    mc = [{"query": "Question: 1+1?\nAnswer:", "choices": [" 2", " 3"], "gold": 0},
          {"query": "Question: 2+2?\nAnswer:", "choices": [" 5", " 4"], "gold": 1}]
    text = "def f(x):\n    return x + 1\n"
    gen = [{"query": "x = ", "answer": "1"}]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task(tasks, "lt_mc", "multiple_choice", mc)
    _task(tasks, "lt_roll", "loglikelihood_rolling", [{"text": text}])
    _task(tasks, "lt_gen", "generate_until", gen)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                          f"pretrained={path},trust_remote_code=True,dtype=float32", "--device", "cpu",
                          "--tasks", "lt_mc,lt_roll,lt_gen", "--include_path", str(tasks), "--batch_size", "2",
                          "--output_path", str(tmp_path / "out"), "--log_samples"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (results,) = tmp_path.glob("out/**/results_*.json")
    got = json.loads(results.read_text())["results"]

    hf = wrap(model, 64)

    def ll(context: bytes, cont: bytes) -> float:
        ids = torch.tensor([[BOS, *context, *cont]])
        logp = hf(ids).logits.log_softmax(-1)[0]
        start = 1 + len(context)
        return sum(logp[i - 1, ids[0, i]].item() for i in range(start, ids.shape[1]))

    pick = [max(range(2), key=lambda j: ll(r["query"].encode(), r["choices"][j].encode())) for r in mc]
    assert got["lt_mc"]["acc,none"] == pytest.approx(sum(p == r["gold"] for p, r in zip(pick, mc)) / len(mc))
    # Rolling: one window (the text is shorter than 64 bytes) after lm_eval's prefix token (the tokenizer's BOS).
    nll = -ll(b"", text.encode())
    assert got["lt_roll"]["bits_per_byte,none"] == pytest.approx(nll / len(text.encode()) / math.log(2), rel=1e-4)
    (samples,) = tmp_path.glob("out/**/samples_lt_gen_*.jsonl")
    resp = json.loads(samples.read_text().splitlines()[0])["resps"][0][0]
    ref = generate(model, ["x = "], 12, temperature=0, seed=0, stop=[b"\n"])[0].decode(errors="replace")
    assert resp == ref.split("\n")[0]


def test_without_transformers_the_import_names_the_extra(monkeypatch):
    import importlib

    from learntok.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    monkeypatch.delitem(sys.modules, "learntok.transformers_model")
    with pytest.raises(MissingDependency, match=r"learntok\[transformers\]"):
        importlib.import_module("learntok.transformers_model")
