"""Image warps (op-reference §9)."""
