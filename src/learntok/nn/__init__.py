"""Neural-network primitives shared by the U-Net, the boundary strategies and the entropy model: attention
kernels, Gemma-2 blocks with `forward()` (a whole sequence) and `step()` (one new position against a KV cache).
Pure PyTorch, no device code; nothing here imports the rest of learntok."""
