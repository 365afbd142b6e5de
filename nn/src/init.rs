//! Parameter initialisation: PyTorch's `nn.init` functions, drawing from one
//! seedable generator.
