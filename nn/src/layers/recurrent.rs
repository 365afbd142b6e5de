//! Recurrent layers: LSTM and GRU with PyTorch's parameter names.
