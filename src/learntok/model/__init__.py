"""The autoregressive U-Net and its layers."""
