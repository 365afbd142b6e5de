//! ONNX export of Forma models.
//!
//! [`export_onnx`] captures a model's forward ([`forma_nn::capture`]: it
//! runs at the example's sizes and at larger ones, and the two graphs must
//! agree) and writes the captured graph as an ONNX model
//! (opset 17, IR version 8): the parameters and buffers are initializers
//! named by their `state_dict` keys, each node is named by the module path
//! that ran it (`/encoder/layers.0/linear1/Gemm`), and the `Dyn` sizes of
//! the inputs are symbolic axes (`batch`, `seq`) so one file serves every
//! batch size and sequence length. ONNX Runtime, tract, TensorRT and the
//! browser runtimes read it.
//!
//! ```no_run
//! use forma::prelude::*;
//! use forma::nn::layers::{Linear, Relu};
//! use forma_onnx::{export_onnx, OnnxOptions};
//!
//! #[derive(Module, Sequential)]
//! #[sequential(input = [B, 4], output = [B, 2])]
//! struct Mlp {
//!     fc1: Linear<4, 8>,
//!     act: Relu,
//!     fc2: Linear<8, 2>,
//! }
//!
//! let mut rng = Rng::seed_from(0);
//! let model = Mlp { fc1: Linear::new(&Cpu, &mut rng), act: Relu, fc2: Linear::new(&Cpu, &mut rng) };
//! let example = Tensor::<(Dyn, C<4>)>::zeros_on((Dyn(1), C), &Cpu);
//! export_onnx(&model, example, "mlp.onnx", &OnnxOptions::default()).unwrap();
//! ```
//!
//! An op with no ONNX form stops the export with an error naming the op
//! and the module path; the exporter never writes a graph that computes
//! something else.

pub mod proto;

mod lower;

use forma_core::graph::{Graph, Source};
use forma_core::{Error, Result};
use forma_nn::capture::{capture_with, CaptureOptions};
use forma_nn::{Forward, Module};
use prost::Message;
use std::path::Path;

pub use forma_core::graph::Traced;

/// The opset the exporter writes.
pub const OPSET: i64 = 17;
/// The ONNX IR version that goes with [`OPSET`].
pub const IR_VERSION: i64 = 8;

/// Options of an export.
#[derive(Clone, Debug, Default)]
pub struct OnnxOptions {
    /// The names of the inputs and of their symbolic sizes.
    pub capture: CaptureOptions,
    /// The names of the outputs (default `output`, or `output0`, .. for
    /// several).
    pub output_names: Vec<String>,
}

/// What an export wrote.
#[derive(Clone, Debug)]
pub struct ExportSummary {
    /// The captured graph.
    pub graph: Graph,
    /// The size of the file in bytes.
    pub bytes: usize,
    /// The bytes of parameters and constants it holds.
    pub weight_bytes: usize,
}

/// Captures `model`'s forward on `example` and writes it to `path` as an
/// ONNX model.
///
/// # Errors
/// What the capture returns (a data-dependent step, an op with no graph
/// form), an op with no ONNX mapping (named, with its module path), or
/// an I/O error writing the file.
pub fn export_onnx<M, X, Y>(
    model: &M,
    example: X,
    path: impl AsRef<Path>,
    opts: &OnnxOptions,
) -> Result<ExportSummary>
where
    M: Module + Forward<X, Y>,
    X: Traced,
    Y: Traced,
{
    let graph = capture_with(model, example, &opts.capture)?;
    let bytes = to_onnx_bytes(&graph, &opts.output_names)?;
    let path = path.as_ref();
    let tmp = path.with_extension("onnx.tmp");
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::invalid("export_onnx", format!("writing {}: {e}", path.display())))?;
    let weight_bytes = graph
        .values
        .iter()
        .map(|v| match &v.source {
            Source::Param(d) | Source::Constant(d) => d.bytes().len(),
            _ => 0,
        })
        .sum();
    Ok(ExportSummary {
        graph,
        bytes: bytes.len(),
        weight_bytes,
    })
}

/// The ONNX model of a captured graph, encoded.
///
/// # Errors
/// An op with no ONNX mapping, named with its module path.
pub fn to_onnx_bytes(graph: &Graph, output_names: &[String]) -> Result<Vec<u8>> {
    Ok(to_onnx(graph, output_names)?.encode_to_vec())
}

/// The ONNX model of a captured graph.
///
/// # Errors
/// An op with no ONNX mapping, named with its module path.
pub fn to_onnx(graph: &Graph, output_names: &[String]) -> Result<proto::ModelProto> {
    let g = graph;
    let mut names: Vec<String> = g.values.iter().map(|v| v.name.clone()).collect();
    // Outputs take their public names; an output that is an input or a
    // parameter (a forward that returns what it was given), or a value
    // returned twice, gets an `Identity` under its name.
    let n_out = g.outputs.len();
    let mut copies = Vec::new();
    let mut outputs = Vec::new();
    let mut renamed = Vec::new();
    for (k, &o) in g.outputs.iter().enumerate() {
        let name = match (output_names.get(k), n_out) {
            (Some(n), _) => n.clone(),
            (None, 1) => "output".into(),
            (None, _) => format!("output{k}"),
        };
        let v = &g.values[o];
        if matches!(v.source, Source::Node(_)) && !renamed.contains(&o) {
            names[o] = name.clone();
            renamed.push(o);
        } else {
            copies.push((o, name.clone()));
        }
        outputs.push(lower::value_info(&name, v.dtype, &v.dims));
    }
    let mut low = lower::Lower::new(g, names.clone());
    low.run()?;
    let mut out = low.out;
    for (o, name) in copies {
        out.node.push(proto::NodeProto {
            input: vec![names[o].clone()],
            output: vec![name.clone()],
            name: format!("/Identity_{name}"),
            op_type: "Identity".into(),
            ..Default::default()
        });
    }
    out.initializer = lower::initializers(g, &names);
    out.input = g
        .inputs
        .iter()
        .map(|&i| lower::value_info(&names[i], g.values[i].dtype, &g.values[i].dims))
        .collect();
    out.output = outputs;
    Ok(proto::ModelProto {
        ir_version: IR_VERSION,
        producer_name: "forma".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: String::new(),
        graph: Some(out),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: String::new(),
            version: OPSET,
        }],
    })
}
