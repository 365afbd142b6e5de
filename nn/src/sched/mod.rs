//! Learning-rate schedulers, stepping an optimizer's groups like PyTorch's.
