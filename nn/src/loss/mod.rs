//! Loss functions with PyTorch's reductions (`mean`, `sum`, `none`).
