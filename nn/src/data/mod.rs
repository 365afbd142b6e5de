//! Datasets, the DataLoader, and readers for MNIST-format IDX files.
