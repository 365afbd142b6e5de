// `hf_config!` writes the model type a config.json describes, with the
// derived sizes computed (GPT-2's QKV = 3 × n_embd, n_inner null = 4 × n_embd).
use forma::prelude::*;
use forma_models::gpt2::Gpt2Config;

forma_models::hf_config!(type TinyGpt2 = "../../../tools/fixtures/models/gpt2_text/config.json";);

fn main() {
    let model = TinyGpt2::new(&Gpt2Config::with_layers(1), &Cpu, &mut Rng::seed_from(0));
    let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![1, 2, 3], (Dyn(1), Dyn(3))).unwrap();
    // The vocabulary (320) is the logits' static width.
    let logits: Tensor<(Dyn, Dyn, C<320>)> = model.logits(&ids).unwrap();
    assert_eq!(logits.dims()[..], [1, 3, 320]);
}
