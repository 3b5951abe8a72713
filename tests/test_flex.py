"""The FlexAttention backend against the dense reference: soft-cap as a score modification, the causal and
sliding-window structure as block masks; fp32 exact, bf16 within tolerance. PyTorch's FlexAttention has no
backward pass on CPU, so gradients are compared on CUDA only (skipped here) and training on CPU is refused."""

from __future__ import annotations

import pytest
import torch

from learntok.nn import attention
from learntok.nn.attention import attend, reference_attention, resolve_backend

from .conftest import build_model

CASES = [(8, 0.0), (8, 50.0), (5, 30.0), (40, 50.0), (None, 50.0), (None, 0.0)]
CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture
def unfused(monkeypatch):
    """FlexAttention's eager path (materialised scores, same maths): no compilation in the fast tests."""
    monkeypatch.setattr(attention, "FLEX_COMPILE", False)


def _qkv(T=70, device="cpu", grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 2, T, 16, generator=g).to(device).requires_grad_(grad) for _ in range(3)]


@pytest.mark.parametrize("window,cap", CASES)
def test_flex_matches_dense_reference(unfused, window, cap):
    q, k, v = _qkv()
    out = attend(q, k, v, window=window, cap=cap, backend="flex")
    torch.testing.assert_close(out, reference_attention(q, k, v, window=window, cap=cap), rtol=0, atol=1e-5)


def test_compiled_flex_kernel_matches_dense_reference():
    """The fused kernel torch.compile builds (C++ on CPU, from the template Triton uses on CUDA), on a sliding
    window with the soft-cap and on the token level's full causal mask: within 1e-5 in fp32."""
    q, k, v = _qkv(T=100)
    for window in (8, None):
        out = attend(q, k, v, window=window, cap=50.0, backend="flex")
        torch.testing.assert_close(out, reference_attention(q, k, v, window=window, cap=50.0), rtol=0, atol=1e-5)


@pytest.mark.skipif(not CUDA, reason="FlexAttention's backward pass runs on CUDA only")
@pytest.mark.parametrize("window,cap", CASES)
def test_flex_gradients_match_dense_reference_on_cuda(window, cap):
    q, k, v = _qkv(device="cuda", grad=True)
    ref = reference_attention(q, k, v, window=window, cap=cap)
    out = attend(q, k, v, window=window, cap=cap, backend="flex")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(out.square().sum(), (q, k, v)),
                    torch.autograd.grad(ref.square().sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_flex_refuses_to_train_on_cpu(unfused):
    q, k, v = _qkv(grad=True)
    with pytest.raises(ValueError, match="cannot train on CPU"):
        attend(q, k, v, window=8, cap=50.0, backend="flex")
    attend(q.detach(), k.detach(), v.detach(), window=8, cap=50.0, backend="flex")  # evaluation is fine


@pytest.mark.parametrize("window", [8, None])
def test_flex_in_bf16_is_within_bf16_tolerance(unfused, window):
    q, k, v = _qkv()
    ref = reference_attention(q, k, v, window=window, cap=50.0)
    out = attend(*(t.bfloat16() for t in (q, k, v)), window=window, cap=50.0, backend="flex")
    assert out.dtype == torch.bfloat16
    err = (out.float() - ref).abs().max().item()
    assert 0 < err < 3e-2, err  # > 0: bf16 really ran


def test_auto_backend_resolves_on_the_inputs_device():
    assert resolve_backend("auto", 50.0, torch.device("cuda")) == "flex"
    assert resolve_backend("auto", 50.0, torch.device("cpu")) == "eager"
    assert resolve_backend("auto", 0.0, torch.device("cpu")) == "sdpa"
    assert resolve_backend("eager", 50.0, torch.device("cuda")) == "eager"


def test_model_with_flex_equals_model_with_eager(unfused):
    """The whole U-Net (sliding byte windows and the padded token level) gives the same logits."""
    eager = build_model("uniform", model_kw={"attn_softcap": 50.0}).eval()
    flex = build_model("uniform", model_kw={"attn_softcap": 50.0, "attn_backend": "flex"}).eval()
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(flex(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)


def test_lengths_share_one_padded_kernel_shape(unfused, monkeypatch):
    """Token counts vary per batch: lengths are padded to a multiple of FLEX_BUCKET for the kernel (one block
    mask, one compiled shape per bucket) and the result is unchanged."""
    shapes = []
    real = attention._flex_block_mask

    def spy(T, window, device):
        shapes.append(T)
        return real(T, window, device)

    monkeypatch.setattr(attention, "_flex_block_mask", spy)
    for T in (37, 70, 128, 129):
        q, k, v = _qkv(T=T)
        out = attend(q, k, v, window=None, cap=50.0, backend="flex")
        assert out.shape == q.shape
        torch.testing.assert_close(out, reference_attention(q, k, v, window=None, cap=50.0), rtol=0, atol=1e-5)
    assert shapes == [128, 128, 128, 256]
