//! Text in, text out against `transformers`, `tokenizers` and
//! sentence-transformers (fixtures from `tools/gen_text_fixtures.py`: two
//! Hugging Face model folders with tokenizers trained there, and
//! `text_io.json`): the token ids and masks are the Python tokenizer's
//! exactly, padding and truncation included; the sentence embeddings and
//! their cosine matrix are sentence-transformers' within 1e-5; GPT-2's
//! greedy continuation of a prompt string is `generate`'s token for token
//! and decodes to the same string; `config.json` is checked against the
//! Rust type, naming the field that differs.

use forma::nn::Module;
use forma::prelude::*;
use forma_models::bert::Bert;
use forma_models::gpt2::{Gpt2LMHeadModel, Sampling};
use forma_models::text::{cos_sim, load_tokenizer, SentenceEncoder, TextGenerator};
use forma_models::ModelError;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// `gen_text_fixtures.py`'s tiny BERT: vocabulary 143 (`BERT_VOCAB`), the
/// rest `TINY_BERT`'s sizes.
type TextBert = Bert<143, 32, 4, 37, 40, 2>;
/// Its tiny GPT-2: vocabulary 320 (`GPT2_VOCAB`), the rest `TINY_GPT2`'s.
type TextGpt2 = Gpt2LMHeadModel<320, 64, 32, 96, 4, 128>;

const TOL: f32 = 1e-5;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/fixtures/models")
        .join(name)
}

/// `text_io.json`.
fn io() -> Value {
    let path = fixture("text_io.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} (run tools/gen_text_fixtures.py): {e}", path.display()));
    serde_json::from_str(&text).expect("text_io.json is JSON")
}

fn strings(v: &Value) -> Vec<String> {
    serde_json::from_value(v.clone()).expect("a list of strings")
}

fn ints(v: &Value) -> Vec<i64> {
    let rows: Vec<Vec<i64>> = match v.get(0) {
        Some(Value::Array(_)) => serde_json::from_value(v.clone()).expect("rows of integers"),
        _ => vec![serde_json::from_value(v.clone()).expect("integers")],
    };
    rows.concat()
}

fn floats(v: &Value) -> Vec<f32> {
    let rows: Vec<Vec<f64>> = serde_json::from_value(v.clone()).expect("rows of numbers");
    rows.concat().into_iter().map(|x| x as f32).collect()
}

/// Fails with the first index where `got` and `want` differ by more than `tol`.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let (mut worst, mut at) = (0.0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        assert!(!d.is_nan(), "{what}[{i}]: {g} vs {w}");
        if d > worst {
            (worst, at) = (d, i);
        }
    }
    println!("{what}: max |diff| {worst:e} (tolerance {tol:e})");
    assert!(
        worst <= tol,
        "{what}[{at}]: {} vs {} (|diff| {worst} > {tol})",
        got[at],
        want[at]
    );
}

fn encoder() -> SentenceEncoder<TextBert> {
    SentenceEncoder::<TextBert>::from_pretrained_dir(fixture("bert_text"), &Cpu)
        .expect("load tools/fixtures/models/bert_text")
        .model
}

fn sentences(io: &Value) -> Vec<String> {
    strings(&io["bert.sentences"])
}

/// A copy of a fixture folder in the temp dir, for tests that edit it.
struct TempFolder(PathBuf);

impl TempFolder {
    fn copy_of(name: &str, tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("forma-text-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(fixture(name)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        TempFolder(dir)
    }

    /// Rewrites one of the folder's JSON files.
    fn edit_json(&self, file: &str, edit: impl FnOnce(&mut Value)) {
        let path = self.0.join(file);
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn token_ids_and_masks_match_the_python_tokenizer() {
    let io = io();
    let texts = sentences(&io);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batch = encoder().tokenize(&texts).unwrap();
    let want_ids = ints(&io["bert.input_ids"]);
    let len = want_ids.len() / texts.len();
    assert_eq!(
        batch.input_ids.dims()[..],
        [texts.len(), len],
        "padded to the longest text"
    );
    assert_eq!(batch.input_ids.to_vec(), want_ids, "input_ids");
    assert_eq!(
        batch.attention_mask.to_vec(),
        ints(&io["bert.attention_mask"]),
        "attention_mask"
    );
}

#[test]
fn truncation_matches_sentence_transformers_max_seq_length() {
    let io = io();
    let texts = sentences(&io);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let max_len = io["bert.truncate_to"].as_u64().unwrap() as usize;
    let full = encoder();
    let short = SentenceEncoder::new(full.model, full.tokenizer, max_len).unwrap();
    assert_eq!(short.max_len, max_len);
    let batch = short.tokenize(&texts).unwrap();
    assert_eq!(batch.input_ids.dims()[..], [texts.len(), max_len]);
    assert_eq!(
        batch.input_ids.to_vec(),
        ints(&io["bert.truncated_ids"]),
        "input_ids"
    );
    assert_eq!(
        batch.attention_mask.to_vec(),
        ints(&io["bert.truncated_mask"]),
        "attention_mask"
    );
}

#[test]
fn the_files_padding_and_truncation_settings_are_overridden() {
    // The hub's all-MiniLM-L6-v2 tokenizer.json pads every text to 128 and
    // truncates at 128; transformers ignores both unless asked, and so must
    // the encoder.
    let folder = TempFolder::copy_of("bert_text", "fixed-padding");
    folder.edit_json("tokenizer.json", |t| {
        t["padding"] = serde_json::json!({
            "strategy": {"Fixed": 30}, "direction": "Right", "pad_to_multiple_of": null,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"
        });
        t["truncation"] = serde_json::json!({
            "direction": "Right", "max_length": 6, "strategy": "LongestFirst", "stride": 0
        });
    });
    let raw = load_tokenizer(folder.path().join("tokenizer.json")).unwrap();
    assert_eq!(
        raw.encode("Rust", true).unwrap().len(),
        30,
        "the file's own settings pad to 30"
    );
    let io = io();
    let texts = sentences(&io);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let encoder = SentenceEncoder::<TextBert>::from_pretrained_dir(folder.path(), &Cpu)
        .unwrap()
        .model;
    let batch = encoder.tokenize(&texts).unwrap();
    assert_eq!(batch.input_ids.to_vec(), ints(&io["bert.input_ids"]));
    assert_eq!(
        batch.attention_mask.to_vec(),
        ints(&io["bert.attention_mask"])
    );
}

#[test]
fn sentence_embeddings_and_cosines_match_sentence_transformers() {
    let io = io();
    let texts = sentences(&io);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let encoder = encoder();
    let emb = encoder.embed(&texts).unwrap();
    assert_eq!(emb.dims()[..], [texts.len(), 32]);
    assert_close(
        "embeddings",
        &emb.to_vec(),
        &floats(&io["bert.embeddings"]),
        TOL,
    );
    let cos = cos_sim(&emb, &emb).unwrap();
    assert_eq!(cos.dims()[..], [texts.len(), texts.len()]);
    assert_close("cosine", &cos.to_vec(), &floats(&io["bert.cosine"]), TOL);

    // One at a time (no padding) gives the same rows: padding is masked out.
    for (i, text) in texts.iter().enumerate() {
        let one = encoder.embed(&[text]).unwrap().to_vec();
        assert_close(
            &format!("embedding {i} alone"),
            &one,
            &emb.to_vec()[i * 32..(i + 1) * 32],
            TOL,
        );
    }
    assert_eq!(encoder.embed(&[]).unwrap().dims()[..], [0, 32]);
}

#[test]
fn gpt2_prompt_greedy_ids_and_text_match_transformers() {
    let io = io();
    let loaded =
        TextGenerator::<TextGpt2>::from_pretrained_dir(fixture("gpt2_text"), &Cpu).unwrap();
    assert!(loaded.report.dropped.is_empty(), "{:?}", loaded.report);
    let generator = loaded.model;
    let prompt = io["gpt2.prompt"].as_str().unwrap();
    let want_prompt: Vec<u32> = ints(&io["gpt2.prompt_ids"])
        .iter()
        .map(|&i| i as u32)
        .collect();
    assert_eq!(generator.encode(prompt).unwrap(), want_prompt, "prompt ids");

    let n = io["gpt2.new_tokens"].as_u64().unwrap() as usize;
    let out = generator
        .generate(prompt, n, Sampling::Greedy, &mut Rng::seed_from(0))
        .unwrap();
    let want: Vec<u32> = ints(&io["gpt2.generated_ids"])
        .iter()
        .map(|&i| i as u32)
        .collect();
    assert_eq!(out.prompt_len, want_prompt.len());
    assert_eq!(out.ids, want, "greedy ids");
    assert_eq!(out.text, io["gpt2.text"].as_str().unwrap(), "decoded text");
}

#[test]
fn config_is_read_into_the_run_time_settings() {
    let config = TextGpt2::read_hf_config(fixture("gpt2_text/config.json")).unwrap();
    assert_eq!((config.n_layer, config.layer_norm_epsilon), (2, 1e-5));
    let config = TextBert::read_hf_config(fixture("bert_text/config.json")).unwrap();
    assert_eq!(
        (config.num_hidden_layers, config.layer_norm_eps),
        (2, 1e-12)
    );
    let bert = TextBert::from_pretrained_dir(fixture("bert_text"), &Cpu).unwrap();
    assert!(!bert.model.is_training());
    assert_eq!(bert.model.encoder.layer.len(), 2);
    assert_eq!(bert.tokenizer.get_vocab_size(true), 143);
}

/// The `ConfigMismatch` a load gives, or a panic.
fn mismatch(result: Result<impl std::fmt::Debug, ModelError>) -> (String, String, String, String) {
    match result {
        Err(e @ ModelError::ConfigMismatch { .. }) => {
            let message = e.to_string();
            let ModelError::ConfigMismatch {
                field,
                found,
                expected,
                ..
            } = e
            else {
                unreachable!()
            };
            (field, found, expected, message)
        }
        other => panic!("expected a config mismatch, got {other:?}"),
    }
}

#[test]
fn a_config_that_differs_from_the_type_names_the_field() {
    // Hidden 64 where the file has n_embd = 32.
    type Wide = Gpt2LMHeadModel<320, 64, 64, 192, 4, 256>;
    let (field, found, expected, message) =
        mismatch(Wide::from_pretrained_dir(fixture("gpt2_text"), &Cpu));
    assert_eq!(
        (field.as_str(), found.as_str(), expected.as_str()),
        ("n_embd", "32", "64")
    );
    assert!(
        message.ends_with(
            "config.json: the file has n_embd = 32, the type has 64 \
             (the file describes `Gpt2LMHeadModel<320, 64, 32, 96, 4, 128>`)"
        ),
        "{message}"
    );

    // MiniLM's vocabulary against the tiny file.
    type BigVocab = Bert<30522, 32, 4, 37, 40, 2>;
    let (field, found, expected, _) = mismatch(SentenceEncoder::<BigVocab>::from_pretrained_dir(
        fixture("bert_text"),
        &Cpu,
    ));
    assert_eq!(
        (field.as_str(), found.as_str(), expected.as_str()),
        ("vocab_size", "143", "30522")
    );

    // A setting the model does not implement.
    let folder = TempFolder::copy_of("bert_text", "relu");
    folder.edit_json("config.json", |c| c["hidden_act"] = "relu".into());
    let (field, found, expected, message) =
        mismatch(TextBert::from_pretrained_dir(folder.path(), &Cpu));
    assert_eq!(
        (field.as_str(), found.as_str(), expected.as_str()),
        ("hidden_act", "\"relu\"", "\"gelu\"")
    );
    assert!(
        message.contains("the file has hidden_act = \"relu\", the type has \"gelu\""),
        "{message}"
    );

    // A field left out takes transformers' default: n_inner null is 4 * n_embd,
    // a missing n_positions is 1024.
    let folder = TempFolder::copy_of("gpt2_text", "defaults");
    folder.edit_json("config.json", |c| {
        c.as_object_mut().unwrap().remove("n_positions");
    });
    let (field, found, _, _) = mismatch(TextGpt2::from_pretrained_dir(folder.path(), &Cpu));
    assert_eq!((field.as_str(), found.as_str()), ("n_positions", "1024"));
}

#[test]
fn a_layer_count_the_weights_lack_is_refused_by_key() {
    let folder = TempFolder::copy_of("bert_text", "layers");
    folder.edit_json("config.json", |c| c["num_hidden_layers"] = 3.into());
    match TextBert::from_pretrained_dir(folder.path(), &Cpu) {
        Err(ModelError::Load { path, source }) => {
            assert!(path.ends_with("model.safetensors"), "{path}");
            assert!(source.to_string().contains("encoder.layer.2."), "{source}");
        }
        other => panic!("expected a load error, got {other:?}"),
    }
}

#[test]
fn a_missing_or_broken_file_is_named() {
    let folder = TempFolder::copy_of("bert_text", "broken");
    std::fs::write(folder.path().join("config.json"), "{ not json").unwrap();
    let e = TextBert::from_pretrained_dir(folder.path(), &Cpu).unwrap_err();
    assert!(matches!(e, ModelError::ConfigFile { .. }), "{e:?}");
    assert!(e.to_string().contains("config.json: not JSON"), "{e}");

    std::fs::remove_file(folder.path().join("tokenizer.json")).unwrap();
    let e = load_tokenizer(folder.path().join("tokenizer.json")).unwrap_err();
    assert!(matches!(e, ModelError::Tokenizer { .. }), "{e:?}");
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}
