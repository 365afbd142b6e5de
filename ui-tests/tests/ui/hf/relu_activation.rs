// A BERT config.json asking for ReLU: forma_models' Bert implements the exact
// GELU only, so the alias is refused when the program is built, naming the
// field.
forma_models::hf_config!(type Model = "relu_bert.json";);

fn main() {}
