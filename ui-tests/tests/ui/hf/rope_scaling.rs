// Llama 3's scaled rotary positions are not implemented: the config file
// that asks for them does not give a type.
forma_models::hf_config!(type Model = "llama3_rope.json";);

fn main() {}
