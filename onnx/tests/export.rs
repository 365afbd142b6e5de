//! What an exported file holds: opset and IR version, initializers under
//! their `state_dict` keys, nodes named by module path, symbolic axes by
//! name; and the refusals, which name the op and the module path.

use forma::nn::layers::{Linear, Lstm, Relu};
use forma::nn::Module as _;
use forma::prelude::*;
use forma_onnx::proto::{DimValue, ModelProto};
use forma_onnx::{export_onnx, to_onnx, OnnxOptions, IR_VERSION, OPSET};
use prost::Message;

#[derive(Module, Sequential)]
#[sequential(input = [B, 4], output = [B, 2])]
struct Mlp {
    fc1: Linear<4, 8>,
    act: Relu,
    fc2: Linear<8, 2>,
}

fn mlp() -> Mlp {
    let mut rng = Rng::seed_from(0);
    Mlp {
        fc1: Linear::new(&Cpu, &mut rng),
        act: Relu,
        fc2: Linear::new(&Cpu, &mut rng),
    }
}

#[test]
fn a_file_names_its_weights_nodes_and_axes_like_pytorch() {
    let model = mlp();
    let dir = std::env::temp_dir().join(format!("forma-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.onnx");
    let x = Tensor::<(Dyn, C<4>)>::zeros_on((Dyn(3), C), &Cpu);
    let summary = export_onnx(&model, x, &path, &OnnxOptions::default()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(summary.bytes, bytes.len());
    let m = ModelProto::decode(&bytes[..]).unwrap();
    assert_eq!(m.ir_version, IR_VERSION);
    assert_eq!(m.opset_import[0].version, OPSET);
    let g = m.graph.unwrap();
    let inits: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(inits, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
    // The weights are the model's, byte for byte (f32 little-endian).
    let w: Vec<f32> = g.initializer[0]
        .raw_data
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(w, model.fc1.weight.to_vec());
    assert_eq!(g.initializer[0].dims, [8, 4]);
    let nodes: Vec<(&str, &str)> = g
        .node
        .iter()
        .map(|n| (n.name.as_str(), n.op_type.as_str()))
        .collect();
    assert_eq!(
        nodes,
        [
            ("/fc1/Gemm", "Gemm"),
            ("/act/Relu", "Relu"),
            ("/fc2/Gemm", "Gemm")
        ]
    );
    let input = &g.input[0];
    assert_eq!(input.name, "input");
    let dims = &input.r#type.as_ref().unwrap().tensor_type.as_ref().unwrap();
    let dims = &dims.shape.as_ref().unwrap().dim;
    assert_eq!(dims[0].value, Some(DimValue::DimParam("batch".into())));
    assert_eq!(dims[1].value, Some(DimValue::DimValue(4)));
    assert_eq!(g.output[0].name, "output");
    // The file is the weights and a little more.
    let weights: usize = model.num_parameters() * 4;
    assert_eq!(summary.weight_bytes, weights);
    assert!(
        bytes.len() > weights && bytes.len() < weights + 1024,
        "{}",
        bytes.len()
    );
}

#[test]
fn the_graph_prints_one_node_per_line_with_its_module_path() {
    let x = Tensor::<(Dyn, C<4>)>::zeros_on((Dyn(3), C), &Cpu);
    let g = forma::nn::capture::capture(&mlp(), x).unwrap();
    let text = g.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "graph(%input: f32[batch, 4]):");
    assert_eq!(lines[1], "    %fc1.weight: f32[8, 4] = param");
    assert!(
        lines.iter().any(|l| l.ends_with("= relu(%v5)  # act")),
        "{text}"
    );
    assert_eq!(*lines.last().unwrap(), "    return (%v7)");
    assert_eq!(lines.len(), 1 + 4 + 3 + 1, "{text}");
}

/// A two-layer LSTM with dropout between its layers.
#[derive(Module)]
struct Tagger {
    lstm: Lstm<3, 4>,
}

impl Forward<Tensor<(Dyn, Dyn, C<3>)>, Tensor<(Dyn, Dyn, C<4>)>> for Tagger {
    fn try_forward(&self, x: Tensor<(Dyn, Dyn, C<3>)>) -> forma::Result<Tensor<(Dyn, Dyn, C<4>)>> {
        forma::nn::child!(self.lstm, x)
    }
}

#[test]
fn lstm_dropout_in_training_is_refused_naming_the_layer_and_its_path() {
    use forma::nn::layers::RnnOptions;
    let mut rng = Rng::seed_from(1);
    let options = RnnOptions {
        num_layers: 2,
        dropout: 0.5,
        ..Default::default()
    };
    let mut model = Tagger {
        lstm: Lstm::with_options(options, &Cpu, &mut rng),
    };
    let x = Tensor::<(Dyn, Dyn, C<3>)>::zeros_on((Dyn(2), Dyn(5), C), &Cpu);
    let err = forma::nn::capture::capture(&model, x.clone())
        .unwrap_err()
        .to_string();
    assert!(err.contains("`LSTM` in module `lstm`"), "{err}");
    assert!(err.contains("dropout between layers"), "{err}");
    // In eval mode the same model is one `lstm` node.
    model.eval();
    let g = forma::nn::capture::capture(&model, x).unwrap();
    assert_eq!(g.op_names(), ["lstm"], "{g}");
    assert_eq!(g.nodes[0].path, "lstm");
}

#[test]
fn an_output_that_is_an_input_becomes_an_identity() {
    #[derive(Module)]
    struct Id;
    impl Forward<Tensor<(Dyn, C<2>)>, Tensor<(Dyn, C<2>)>> for Id {
        fn try_forward(&self, x: Tensor<(Dyn, C<2>)>) -> forma::Result<Tensor<(Dyn, C<2>)>> {
            Ok(x)
        }
    }
    let x = Tensor::<(Dyn, C<2>)>::zeros_on((Dyn(1), C), &Cpu);
    let g = forma::nn::capture::capture(&Id, x).unwrap();
    let g = to_onnx(&g, &[]).unwrap().graph.unwrap();
    assert_eq!(g.node.len(), 1);
    assert_eq!(
        (g.node[0].op_type.as_str(), &g.node[0].input[0][..]),
        ("Identity", "input")
    );
    assert_eq!(g.node[0].output, ["output"]);
    assert_eq!(g.output[0].name, "output");
}

/// Sums the positions of a sequence one by one: a loop over a `Dyn` size.
#[derive(Module)]
struct Unrolled;

impl Forward<Tensor<(Dyn, Dyn, C<3>)>, Tensor<(Dyn, C<3>)>> for Unrolled {
    fn try_forward(&self, x: Tensor<(Dyn, Dyn, C<3>)>) -> forma::Result<Tensor<(Dyn, C<3>)>> {
        let b = x.dims()[0];
        let mut acc = Tensor::<(Dyn, C<3>)>::zeros_on((Dyn(b), C), &Cpu);
        for t in 0..x.dims()[1] {
            let step: Tensor<(Dyn, C<3>)> = x.try_narrow::<1>(t, 1)?.try_reshape_to((Dyn(b), C))?;
            acc = acc + step;
        }
        Ok(acc)
    }
}

#[test]
fn a_loop_over_a_dynamic_size_is_refused_not_unrolled() {
    let x = Tensor::<(Dyn, Dyn, C<3>)>::ones_on((Dyn(2), Dyn(4), C), &Cpu);
    let err = forma::nn::capture::capture(&Unrolled, x)
        .unwrap_err()
        .to_string();
    assert!(err.contains("changes with the input sizes"), "{err}");
    assert!(
        err.contains("batch=2, seq=4") && err.contains("batch=3, seq=6"),
        "{err}"
    );
}

/// Adds position numbers made on the host from the input's length.
#[derive(Module)]
struct HostPositions;

impl Forward<Tensor<(Dyn, Dyn)>, Tensor<(Dyn, Dyn)>> for HostPositions {
    fn try_forward(&self, x: Tensor<(Dyn, Dyn)>) -> forma::Result<Tensor<(Dyn, Dyn)>> {
        let s = x.dims()[1];
        let pos = Tensor::<(Dyn,)>::from_vec((0..s).map(|i| i as f32).collect(), (Dyn(s),))?;
        Ok(x + pos.unsqueeze::<0>())
    }
}

#[test]
fn a_table_built_at_the_example_length_is_refused() {
    let x = Tensor::<(Dyn, Dyn)>::ones_on((Dyn(2), Dyn(5)), &Cpu);
    let err = forma::nn::capture::capture(&HostPositions, x)
        .unwrap_err()
        .to_string();
    assert!(err.contains("changes with the input sizes"), "{err}");
}

/// Exports a model on `ids` and checks the file is its weights' size
/// within 1%.
fn assert_file_is_weight_sized<M, Y>(name: &str, model: &M, ids: Tensor<(Dyn, Dyn), i64>)
where
    M: forma::nn::Module + Forward<Tensor<(Dyn, Dyn), i64>, Y>,
    Y: forma_onnx::Traced,
{
    let g = forma::nn::capture::capture(model, ids).unwrap();
    let bytes = forma_onnx::to_onnx_bytes(&g, &[]).unwrap();
    let weights = 4 * model.num_parameters();
    let ratio = bytes.len() as f64 / weights as f64;
    assert!(
        (ratio - 1.0).abs() < 0.01,
        "{name}: {} bytes for {weights} bytes of weights",
        bytes.len()
    );
    let m = ModelProto::decode(&bytes[..]).unwrap();
    let inputs = &m.graph.as_ref().unwrap().input[0];
    let dims = &inputs
        .r#type
        .as_ref()
        .unwrap()
        .tensor_type
        .as_ref()
        .unwrap()
        .shape;
    let dims: Vec<_> = dims
        .as_ref()
        .unwrap()
        .dim
        .iter()
        .map(|d| d.value.clone())
        .collect();
    assert_eq!(
        dims,
        [
            Some(DimValue::DimParam("batch".into())),
            Some(DimValue::DimParam("seq".into()))
        ]
    );
}

#[test]
fn minilm_and_gpt2_small_export_at_their_weight_size() {
    use forma_models::bert::{BertConfig, MiniLmL6};
    use forma_models::gpt2::{Gpt2Config, Gpt2Small};
    let ids =
        || Tensor::<(Dyn, Dyn), i64>::from_vec(vec![5, 9, 2, 7, 1, 3], (Dyn(2), Dyn(3))).unwrap();
    let mut bert = MiniLmL6::new(&BertConfig::minilm_l6(), &Cpu, &mut Rng::seed_from(8));
    bert.eval();
    assert_file_is_weight_sized("MiniLM-L6", &bert, ids());
    drop(bert);
    let mut gpt2 = Gpt2Small::new(&Gpt2Config::with_layers(12), &Cpu, &mut Rng::seed_from(9));
    gpt2.eval();
    assert_file_is_weight_sized("GPT-2 small", &gpt2, ids());
}

#[test]
fn dropout_in_training_mode_is_refused_naming_the_path() {
    use forma::nn::layers::Dropout;
    #[derive(Module)]
    struct Net {
        fc: Linear<4, 4>,
        drop: Dropout,
    }
    impl Forward<Tensor<(Dyn, C<4>)>, Tensor<(Dyn, C<4>)>> for Net {
        fn try_forward(&self, x: Tensor<(Dyn, C<4>)>) -> forma::Result<Tensor<(Dyn, C<4>)>> {
            let h: Tensor<(Dyn, C<4>)> = forma::nn::child!(self.fc, x)?;
            forma::nn::child!(self.drop, h)
        }
    }
    let mut rng = Rng::seed_from(3);
    let mut net = Net {
        fc: Linear::new(&Cpu, &mut rng),
        drop: Dropout::new(0.5, &mut rng),
    };
    let x = Tensor::<(Dyn, C<4>)>::ones_on((Dyn(2), C), &Cpu);
    let err = forma::nn::capture::capture(&net, x.clone())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`dropout` in module `drop`") && err.contains(".eval()"),
        "{err}"
    );
    net.eval();
    assert_eq!(
        forma::nn::capture::capture(&net, x).unwrap().op_names(),
        ["linear"]
    );
}
