//! Transformer encoder and decoder layers, like PyTorch's.
