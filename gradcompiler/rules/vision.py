"""Image-warp rules (seed: warp_affine_grad_rule; op-reference §9)."""
