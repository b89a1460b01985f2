"""Image functions on Tensors."""
