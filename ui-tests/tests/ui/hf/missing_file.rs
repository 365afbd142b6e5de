// A config.json that is not there (the path is relative to this file).
forma_models::hf_config!(type Model = "no_such/config.json";);

fn main() {}
