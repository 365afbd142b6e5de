//! The full-size models' `state_dict` keys and shapes, in order, against
//! `transformers`' (recorded by `tools/gen_model_fixtures.py` in
//! `layouts.json` from models built on the `meta` device). Forma lists them
//! with `state_dict_layout`, which allocates one element per tensor, so
//! neither side holds GPT-2 small's 500 MB of weights.

mod common;

use forma::prelude::*;
use forma_models::bert::{BertConfig, MiniLmL6};
use forma_models::gpt2::{Gpt2Config, Gpt2Small};

#[test]
fn minilm_l6_has_bert_models_keys_and_shapes() {
    let ours = MiniLmL6::state_dict_layout(&BertConfig::minilm_l6(), &Cpu);
    let (hf, _) = common::layout("layouts.json", "minilm_l6");
    assert_eq!(hf.len(), 103);
    assert_eq!(ours, hf);
    assert_eq!(common::elements(&ours), 22_713_216); // all-MiniLM-L6-v2's parameter count
}

#[test]
fn gpt2_small_has_gpt2_lm_head_models_keys_and_shapes_less_the_tied_head() {
    let ours = Gpt2Small::state_dict_layout(&Gpt2Config::gpt2_small(), &Cpu);
    let (mut hf, doc) = common::layout("layouts.json", "gpt2_small");
    assert_eq!(doc["tied"]["lm_head.weight"], "transformer.wte.weight");
    // `GPT2LMHeadModel.state_dict()` lists the tied head last; Forma's model
    // has it as `transformer.wte.weight` only (see the gpt2 module docs).
    assert_eq!(
        hf.pop(),
        Some(("lm_head.weight".to_string(), vec![50257, 768]))
    );
    assert_eq!(ours, hf);
    assert_eq!(common::elements(&ours), 124_439_808); // GPT-2 small's parameter count
}
