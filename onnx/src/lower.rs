//! From a captured [`Graph`] to ONNX nodes: one function per graph op,
//! each writing the ONNX ops (opset 17) that compute the same values.
//! Symbolic sizes become small shape computations (`Shape` of the input
//! that carries the symbol, then integer arithmetic), so the file runs at
//! any batch size or sequence length.

use crate::proto::{
    AttributeProto, AttributeType, DataType, DimValue, Dimension, GraphProto, NodeProto,
    TensorProto, TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
};
use forma_core::graph::{Dim, Elem, Expr, Graph, Op, Source, ValueId};
use forma_core::ops::conv::Conv2dParams;
use forma_core::ops::reduce::{ArgReduceOp, ReduceOp};
use forma_core::{DType, Error, Result};
use std::collections::HashMap;

/// The ONNX element type of a Forma dtype.
pub(crate) fn data_type(d: DType) -> i32 {
    (match d {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I64 => DataType::Int64,
        DType::U32 => DataType::Uint32,
        DType::Bool => DataType::Bool,
    }) as i32
}

fn attr_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: Some(v),
        r#type: AttributeType::Int as i32,
        ..Default::default()
    }
}

fn attr_f(name: &str, v: f64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        f: Some(v as f32),
        r#type: AttributeType::Float as i32,
        ..Default::default()
    }
}

fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: v.to_vec(),
        r#type: AttributeType::Ints as i32,
        ..Default::default()
    }
}

fn ints<const N: usize>(v: [usize; N]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// A tensor of `dtype` holding `values` (converted), little-endian.
fn tensor_of(name: &str, dtype: DType, dims: &[usize], values: &[f64]) -> TensorProto {
    let mut raw = Vec::new();
    for &v in values {
        match dtype {
            DType::F64 => raw.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => raw.extend_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
            DType::BF16 => raw.extend_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes()),
            DType::I64 => raw.extend_from_slice(&(v as i64).to_le_bytes()),
            DType::U32 => raw.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::Bool => raw.push(u8::from(v != 0.0)),
            DType::F32 => raw.extend_from_slice(&(v as f32).to_le_bytes()),
        }
    }
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: data_type(dtype),
        name: name.into(),
        raw_data: raw,
    }
}

/// The ONNX type of a value with these sizes (symbols by name; an
/// expression of them unnamed).
pub(crate) fn value_info(name: &str, dtype: DType, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: match d {
                Dim::Fixed(n) => Some(DimValue::DimValue(*n as i64)),
                Dim::Sym(e) => match &**e {
                    Expr::Var(v) => Some(DimValue::DimParam(v.clone())),
                    _ => None,
                },
            },
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type(dtype),
                shape: Some(TensorShapeProto { dim }),
            }),
        }),
    }
}

/// The graph being written.
pub(crate) struct Lower<'g> {
    g: &'g Graph,
    pub(crate) out: GraphProto,
    names: Vec<String>,
    fresh: usize,
    node_names: HashMap<String, usize>,
    /// The current node's module path (names the ONNX nodes).
    path: String,
    /// `[1]`-shaped int64 tensors already computed for a size.
    sizes: HashMap<Dim, String>,
}

impl<'g> Lower<'g> {
    /// Lowers `g` with its values named `names` (by value id).
    pub(crate) fn new(g: &'g Graph, names: Vec<String>) -> Self {
        Lower {
            g,
            out: GraphProto {
                name: "forma".into(),
                ..Default::default()
            },
            names,
            fresh: 0,
            node_names: HashMap::new(),
            path: String::new(),
            sizes: HashMap::new(),
        }
    }

    /// Writes every node; the caller fills inputs, outputs and initializers.
    pub(crate) fn run(&mut self) -> Result<()> {
        for n in &self.g.nodes {
            self.path = n.path.clone();
            let ins: Vec<String> = n.inputs.iter().map(|&i| self.names[i].clone()).collect();
            let out = self.names[n.output].clone();
            self.node(&n.op, &n.inputs, n.output, &ins, &out)
                .map_err(|e| {
                    let at = if n.path.is_empty() {
                        String::new()
                    } else {
                        format!(" in module `{}`", n.path)
                    };
                    Error::invalid("export_onnx", format!("`{}`{at}: {e}", n.op.name()))
                })?;
        }
        Ok(())
    }

    fn tmp(&mut self) -> String {
        self.fresh += 1;
        format!("onnx::t{}", self.fresh)
    }

    /// Appends an ONNX node named by the module path and op type
    /// (`/encoder/layers.0/linear1/Gemm`, numbered when repeated).
    fn emit(&mut self, op: &str, ins: &[&str], out: &str, attrs: Vec<AttributeProto>) {
        let base = format!("/{}/{op}", self.path.replace('.', "/"));
        let base = base.replace("//", "/");
        let k = self.node_names.entry(base.clone()).or_insert(0);
        let name = if *k == 0 { base } else { format!("{base}_{k}") };
        *k += 1;
        self.out.node.push(NodeProto {
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: vec![out.to_string()],
            name,
            op_type: op.into(),
            attribute: attrs,
            doc_string: String::new(),
        });
    }

    /// A new value computed by `op`.
    fn op(&mut self, op: &str, ins: &[&str], attrs: Vec<AttributeProto>) -> String {
        let out = self.tmp();
        self.emit(op, ins, &out, attrs);
        out
    }

    /// A constant tensor (a `Constant` node).
    fn constant(&mut self, dtype: DType, dims: &[usize], values: &[f64]) -> String {
        let out = self.tmp();
        let t = tensor_of("", dtype, dims, values);
        let attr = AttributeProto {
            name: "value".into(),
            t: Some(t),
            r#type: AttributeType::Tensor as i32,
            ..Default::default()
        };
        self.emit("Constant", &[], &out, vec![attr]);
        out
    }

    fn scalar(&mut self, dtype: DType, v: f64) -> String {
        self.constant(dtype, &[], &[v])
    }

    fn i64s(&mut self, v: &[i64]) -> String {
        let f: Vec<f64> = v.iter().map(|&x| x as f64).collect();
        self.constant(DType::I64, &[v.len()], &f)
    }

    /// A `[1]` int64 tensor holding `d` at run time.
    fn size(&mut self, d: &Dim) -> Result<String> {
        if let Some(s) = self.sizes.get(d) {
            return Ok(s.clone());
        }
        let s = match d {
            Dim::Fixed(n) => self.i64s(&[*n as i64]),
            Dim::Sym(e) => match &**e {
                Expr::Var(v) => {
                    let sym = self
                        .g
                        .symbols
                        .iter()
                        .find(|s| &s.name == v)
                        .ok_or_else(|| {
                            Error::invalid("export_onnx", format!("unknown size `{v}`"))
                        })?;
                    let input = self.names[self.g.inputs[sym.input]].clone();
                    let a = sym.axis as i64;
                    self.op(
                        "Shape",
                        &[&input],
                        vec![attr_i("start", a), attr_i("end", a + 1)],
                    )
                }
                Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) => {
                    let op = match &**e {
                        Expr::Add(..) => "Add",
                        Expr::Sub(..) => "Sub",
                        Expr::Mul(..) => "Mul",
                        _ => "Div",
                    };
                    let (a, b) = (self.size(a)?, self.size(b)?);
                    self.op(op, &[&a, &b], vec![])
                }
            },
        };
        self.sizes.insert(d.clone(), s.clone());
        Ok(s)
    }

    /// A 1-d int64 tensor of the sizes `dims` at run time.
    fn shape(&mut self, dims: &[Dim]) -> Result<String> {
        if let Some(fixed) = dims.iter().map(Dim::fixed).collect::<Option<Vec<_>>>() {
            let v: Vec<i64> = fixed.iter().map(|&n| n as i64).collect();
            return Ok(self.i64s(&v));
        }
        let parts = dims
            .iter()
            .map(|d| self.size(d))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        Ok(self.op("Concat", &refs, vec![attr_i("axis", 0)]))
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.g.values[v].dtype
    }

    fn dims(&self, v: ValueId) -> &[Dim] {
        &self.g.values[v].dims
    }

    /// A unary table row applied to `x`, into `out`.
    fn unary(&mut self, name: &str, params: &[f64], x: &str, dt: DType, out: &str) -> Result<()> {
        let simple = match name {
            "neg" => Some("Neg"),
            "exp" => Some("Exp"),
            "log" => Some("Log"),
            "sqrt" => Some("Sqrt"),
            "recip" => Some("Reciprocal"),
            "abs" => Some("Abs"),
            "sin" => Some("Sin"),
            "cos" => Some("Cos"),
            "tanh" => Some("Tanh"),
            "sigmoid" => Some("Sigmoid"),
            "relu" => Some("Relu"),
            "hardswish" => Some("HardSwish"),
            _ => None,
        };
        if let Some(op) = simple {
            self.emit(op, &[x], out, vec![]);
            return Ok(());
        }
        match name {
            "log1p" => {
                let one = self.scalar(dt, 1.0);
                let s = self.op("Add", &[x, &one], vec![]);
                self.emit("Log", &[&s], out, vec![]);
            }
            "rsqrt" => {
                let s = self.op("Sqrt", &[x], vec![]);
                self.emit("Reciprocal", &[&s], out, vec![]);
            }
            "square" => self.emit("Mul", &[x, x], out, vec![]),
            "gelu" => {
                // 0.5 x (1 + erf(x / sqrt 2)), PyTorch's exact GELU.
                let c = self.scalar(dt, std::f64::consts::FRAC_1_SQRT_2);
                let s = self.op("Mul", &[x, &c], vec![]);
                let e = self.op("Erf", &[&s], vec![]);
                let one = self.scalar(dt, 1.0);
                let p = self.op("Add", &[&e, &one], vec![]);
                let h = self.scalar(dt, 0.5);
                let xh = self.op("Mul", &[x, &h], vec![]);
                self.emit("Mul", &[&xh, &p], out, vec![]);
            }
            "gelu_tanh" => {
                // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
                let x3 = self.op("Mul", &[x, x], vec![]);
                let x3 = self.op("Mul", &[&x3, x], vec![]);
                let k = self.scalar(dt, 0.044715);
                let t = self.op("Mul", &[&x3, &k], vec![]);
                let t = self.op("Add", &[x, &t], vec![]);
                let c = self.scalar(dt, (2.0 / std::f64::consts::PI).sqrt());
                let t = self.op("Mul", &[&t, &c], vec![]);
                let t = self.op("Tanh", &[&t], vec![]);
                let one = self.scalar(dt, 1.0);
                let p = self.op("Add", &[&t, &one], vec![]);
                let h = self.scalar(dt, 0.5);
                let xh = self.op("Mul", &[x, &h], vec![]);
                self.emit("Mul", &[&xh, &p], out, vec![]);
            }
            "silu" => {
                let s = self.op("Sigmoid", &[x], vec![]);
                self.emit("Mul", &[x, &s], out, vec![]);
            }
            "leaky_relu" => self.emit("LeakyRelu", &[x], out, vec![attr_f("alpha", params[0])]),
            "pow_scalar" | "add_scalar" | "mul_scalar" | "div_scalar" => {
                let c = self.scalar(dt, params[0]);
                let op = match name {
                    "pow_scalar" => "Pow",
                    "add_scalar" => "Add",
                    "mul_scalar" => "Mul",
                    _ => "Div",
                };
                self.emit(op, &[x, &c], out, vec![]);
            }
            "clamp" => {
                let (lo, hi) = (self.scalar(dt, params[0]), self.scalar(dt, params[1]));
                self.emit("Clip", &[x, &lo, &hi], out, vec![]);
            }
            other => {
                return Err(Error::invalid(
                    "export_onnx",
                    format!("the unary op `{other}` has no ONNX mapping"),
                ))
            }
        }
        Ok(())
    }

    fn binary(&mut self, name: &str, a: &str, b: &str, out: &str) -> Result<()> {
        let op = match name {
            "add" => "Add",
            "sub" => "Sub",
            "mul" => "Mul",
            "div" => "Div",
            "pow" => "Pow",
            "maximum" => "Max",
            "minimum" => "Min",
            other => {
                return Err(Error::invalid(
                    "export_onnx",
                    format!("the binary op `{other}` has no ONNX mapping"),
                ))
            }
        };
        self.emit(op, &[a, b], out, vec![]);
        Ok(())
    }

    /// One graph node.
    fn node(
        &mut self,
        op: &Op,
        ids: &[ValueId],
        out_id: ValueId,
        ins: &[String],
        out: &str,
    ) -> Result<()> {
        let x = ins.first().map(String::as_str).unwrap_or("");
        let dt = ids.first().map(|&i| self.dtype(i)).unwrap_or(DType::F32);
        let rank = ids.first().map(|&i| self.dims(i).len()).unwrap_or(0);
        match op {
            Op::Unary { name, params } => self.unary(name, params, x, dt, out)?,
            Op::Binary { name } => self.binary(name, x, &ins[1], out)?,
            Op::Fused { nodes } => {
                let mut vals: Vec<String> = Vec::with_capacity(nodes.len());
                for (k, n) in nodes.iter().enumerate() {
                    let dst = if k + 1 == nodes.len() {
                        out.to_string()
                    } else {
                        self.tmp()
                    };
                    match n {
                        Elem::Arg(i) => {
                            if k + 1 == nodes.len() {
                                self.emit("Identity", &[&ins[*i]], &dst, vec![]);
                            } else {
                                vals.push(ins[*i].clone());
                                continue;
                            }
                        }
                        Elem::Unary { name, params, x } => {
                            let src = vals[*x].clone();
                            self.unary(name, params, &src, dt, &dst)?
                        }
                        Elem::Binary { name, a, b } => {
                            let (a, b) = (vals[*a].clone(), vals[*b].clone());
                            self.binary(name, &a, &b, &dst)?
                        }
                    }
                    vals.push(dst);
                }
            }
            Op::Compare { name } => {
                let onnx = match *name {
                    "eq" | "ne" => "Equal",
                    "lt" => "Less",
                    "le" => "LessOrEqual",
                    "gt" => "Greater",
                    "ge" => "GreaterOrEqual",
                    other => {
                        return Err(Error::invalid(
                            "export_onnx",
                            format!("the comparison `{other}` has no ONNX mapping"),
                        ))
                    }
                };
                if *name == "ne" {
                    let e = self.op(onnx, &[x, &ins[1]], vec![]);
                    self.emit("Not", &[&e], out, vec![]);
                } else {
                    self.emit(onnx, &[x, &ins[1]], out, vec![]);
                }
            }
            Op::Where => self.emit("Where", &[x, &ins[1], &ins[2]], out, vec![]),
            Op::MaskedFill { value } => {
                let v = self.scalar(dt, *value);
                self.emit("Where", &[&ins[1], &v, x], out, vec![]);
            }
            Op::Reduce { op, axis, keepdim } => {
                self.reduce(*op, *axis, *keepdim, ids[0], x, out)?
            }
            Op::ArgReduce { op, axis, keepdim } => {
                let name = match op {
                    ArgReduceOp::ArgMax => "ArgMax",
                    ArgReduceOp::ArgMin => "ArgMin",
                };
                let attrs = vec![
                    attr_i("axis", *axis as i64),
                    attr_i("keepdims", i64::from(*keepdim)),
                ];
                self.emit(name, &[x], out, attrs);
            }
            Op::Cumsum { axis } => {
                let a = self.constant(DType::I64, &[], &[*axis as f64]);
                self.emit("CumSum", &[x, &a], out, vec![]);
            }
            Op::SoftmaxAxis { axis, log } => {
                let name = if *log { "LogSoftmax" } else { "Softmax" };
                self.emit(name, &[x], out, vec![attr_i("axis", *axis as i64)]);
            }
            Op::Matmul => self.emit("MatMul", &[x, &ins[1]], out, vec![]),
            Op::Affine => {
                if rank == 2 {
                    let mut args = vec![x, ins[1].as_str()];
                    if let Some(b) = ins.get(2) {
                        args.push(b);
                    }
                    self.emit("Gemm", &args, out, vec![attr_i("transB", 1)]);
                } else {
                    let wt = self.op("Transpose", &[&ins[1]], vec![attr_ints("perm", &[1, 0])]);
                    match ins.get(2) {
                        Some(b) => {
                            let m = self.op("MatMul", &[x, &wt], vec![]);
                            self.emit("Add", &[&m, b], out, vec![]);
                        }
                        None => self.emit("MatMul", &[x, &wt], out, vec![]),
                    }
                }
            }
            Op::Conv(p) => {
                let attrs = conv_attrs(self.dims(ids[1]), p)?;
                self.emit("Conv", &[x, &ins[1]], out, attrs);
            }
            Op::ConvTranspose { p, output_padding } => {
                let mut attrs = conv_attrs(self.dims(ids[1]), p)?;
                attrs.push(attr_ints("output_padding", &ints(*output_padding)));
                self.emit("ConvTranspose", &[x, &ins[1]], out, attrs);
            }
            Op::MaxPool(p) | Op::AvgPool(p) => {
                let mut attrs = vec![
                    attr_ints("kernel_shape", &ints(p.kernel)),
                    attr_ints("strides", &ints(p.stride)),
                    attr_ints("pads", &pads(p.padding)),
                    attr_i("ceil_mode", i64::from(p.ceil_mode)),
                ];
                if matches!(op, Op::MaxPool(_)) {
                    attrs.push(attr_ints("dilations", &ints(p.dilation)));
                    self.emit("MaxPool", &[x], out, attrs);
                } else {
                    attrs.push(attr_i("count_include_pad", i64::from(p.count_include_pad)));
                    self.emit("AveragePool", &[x], out, attrs);
                }
            }
            Op::LayerNormalization { eps, weight, bias } => {
                let n = self.dims(ids[0])[rank - 1].fixed().ok_or_else(|| {
                    Error::invalid("export_onnx", "layer_norm over a symbolic size")
                })?;
                let mut k = 1;
                let scale = if *weight {
                    k += 1;
                    ins[1].clone()
                } else {
                    self.constant(dt, &[n], &vec![1.0; n])
                };
                let mut args = vec![x.to_string(), scale];
                if *bias {
                    args.push(ins[k].clone());
                }
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                let attrs = vec![attr_i("axis", -1), attr_f("epsilon", *eps)];
                self.emit("LayerNormalization", &refs, out, attrs);
            }
            Op::Attention {
                scale,
                causal,
                mask,
            } => self.attention(ids, ins, *scale, *causal, *mask, dt, out)?,
            Op::IndexSelect { axis } => self.emit(
                "Gather",
                &[x, &ins[1]],
                out,
                vec![attr_i("axis", *axis as i64)],
            ),
            Op::Gather { axis } => self.emit(
                "GatherElements",
                &[x, &ins[1]],
                out,
                vec![attr_i("axis", *axis as i64)],
            ),
            Op::Cat { axis } => {
                let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
                self.emit("Concat", &refs, out, vec![attr_i("axis", *axis as i64)]);
            }
            Op::Cast { to } => {
                self.emit("Cast", &[x], out, vec![attr_i("to", data_type(*to) as i64)])
            }
            Op::Transpose { axes: [a, b] } => {
                let mut perm: Vec<i64> = (0..rank as i64).collect();
                perm.swap(*a, *b);
                self.emit("Transpose", &[x], out, vec![attr_ints("perm", &perm)]);
            }
            Op::Permute { perm } => {
                let perm: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
                self.emit("Transpose", &[x], out, vec![attr_ints("perm", &perm)]);
            }
            Op::Unsqueeze { axis } => {
                let a = self.i64s(&[*axis as i64]);
                self.emit("Unsqueeze", &[x, &a], out, vec![]);
            }
            Op::Squeeze { axis } => {
                let a = self.i64s(&[*axis as i64]);
                self.emit("Squeeze", &[x, &a], out, vec![]);
            }
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => {
                let (s, e) = (self.size(start)?, self.size(end)?);
                let (a, st) = (self.i64s(&[*axis as i64]), self.i64s(&[*step as i64]));
                self.emit("Slice", &[x, &s, &e, &a, &st], out, vec![]);
            }
            Op::Expand { dims } => {
                let s = self.shape(dims)?;
                self.emit("Expand", &[x, &s], out, vec![]);
            }
            Op::Reshape { dims } => {
                let s = self.shape(dims)?;
                self.emit("Reshape", &[x, &s], out, vec![]);
            }
            Op::Rnn {
                cell,
                hidden,
                layers,
                bidirectional,
                bias,
            } => self.rnn(cell, *hidden, *layers, *bidirectional, *bias, ids, ins, out)?,
            Op::Arange { start, step, len } => {
                // Range(start, start + len * step, step) in the output's dtype.
                let dt = self.dtype(out_id);
                let n = self.size(len)?;
                let n = self.op("Squeeze", &[&n], vec![]);
                let n = self.op("Cast", &[&n], vec![attr_i("to", data_type(dt) as i64)]);
                let (a, d) = (self.scalar(dt, *start), self.scalar(dt, *step));
                let span = self.op("Mul", &[&n, &d], vec![]);
                let limit = self.op("Add", &[&a, &span], vec![]);
                self.emit("Range", &[&a, &limit, &d], out, vec![]);
            }
        }
        Ok(())
    }

    /// `w`'s row blocks of `h` rows (one per gate) in the order `order`
    /// (indices of PyTorch's blocks), with a leading axis of 1.
    fn gates(&mut self, w: &str, h: usize, order: &[usize]) -> String {
        let axis = self.i64s(&[0]);
        let blocks: Vec<String> = order
            .iter()
            .map(|&k| {
                let (a, b) = (
                    self.i64s(&[(k * h) as i64]),
                    self.i64s(&[((k + 1) * h) as i64]),
                );
                self.op("Slice", &[w, &a, &b, &axis], vec![])
            })
            .collect();
        let refs: Vec<&str> = blocks.iter().map(String::as_str).collect();
        let w = self.op("Concat", &refs, vec![attr_i("axis", 0)]);
        self.op("Unsqueeze", &[&w, &axis], vec![])
    }

    /// A stack of recurrent layers as ONNX `LSTM`/`GRU` nodes, one per
    /// layer, on `[T, batch, features]` between two transposes; PyTorch's
    /// gate blocks reordered to ONNX's (LSTM `ifgo` to `iofc`, GRU `rzn`
    /// to `zrh` with `linear_before_reset`, which is PyTorch's GRU).
    #[allow(clippy::too_many_arguments)]
    fn rnn(
        &mut self,
        cell: &str,
        h: usize,
        layers: usize,
        bidirectional: bool,
        bias: bool,
        ids: &[ValueId],
        ins: &[String],
        out: &str,
    ) -> Result<()> {
        let (op, order): (&str, &[usize]) = match cell {
            "LSTM" => ("LSTM", &[0, 3, 1, 2]),
            "GRU" => ("GRU", &[1, 0, 2]),
            other => {
                return Err(Error::invalid(
                    "export_onnx",
                    format!("the recurrent cell `{other}` has no ONNX mapping"),
                ))
            }
        };
        let dirs = if bidirectional { 2 } else { 1 };
        let per = if bias { 4 } else { 2 };
        let dt = self.dtype(ids[0]);
        let mut x = self.op("Transpose", &[&ins[0]], vec![attr_ints("perm", &[1, 0, 2])]);
        for layer in 0..layers {
            let (mut w, mut r, mut b) = (Vec::new(), Vec::new(), Vec::new());
            for d in 0..dirs {
                let at = 1 + (layer * dirs + d) * per;
                w.push(self.gates(&ins[at], h, order));
                r.push(self.gates(&ins[at + 1], h, order));
                if bias {
                    let bi = self.gates(&ins[at + 2], h, order);
                    let bh = self.gates(&ins[at + 3], h, order);
                    b.push(self.op("Concat", &[&bi, &bh], vec![attr_i("axis", 1)]));
                }
            }
            let mut stack = |v: Vec<String>| {
                if v.len() == 1 {
                    v.into_iter().next().unwrap_or_default()
                } else {
                    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
                    self.op("Concat", &refs, vec![attr_i("axis", 0)])
                }
            };
            let (w, r) = (stack(w), stack(r));
            let b = if bias { stack(b) } else { String::new() };
            // A zero initial state given explicitly, `[dirs, batch, h]` from
            // the run-time batch (a runtime may need the batch to make its own).
            let batch = self.op("Shape", &[&x], vec![attr_i("start", 1), attr_i("end", 2)]);
            let (d, hs) = (self.i64s(&[dirs as i64]), self.i64s(&[h as i64]));
            let shape = self.op("Concat", &[&d, &batch, &hs], vec![attr_i("axis", 0)]);
            let zero = AttributeProto {
                name: "value".into(),
                t: Some(tensor_of("", dt, &[1], &[0.0])),
                r#type: AttributeType::Tensor as i32,
                ..Default::default()
            };
            let h0 = self.op("ConstantOfShape", &[&shape], vec![zero]);
            let mut args = vec![x.clone(), w, r, b, String::new(), h0.clone()];
            if op == "LSTM" {
                args.push(h0);
            }
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut attrs = vec![attr_i("hidden_size", h as i64)];
            if bidirectional {
                attrs.push(AttributeProto {
                    name: "direction".into(),
                    s: Some(b"bidirectional".to_vec()),
                    r#type: AttributeType::String as i32,
                    ..Default::default()
                });
            }
            if op == "GRU" {
                attrs.push(attr_i("linear_before_reset", 1));
            }
            // Y: [T, dirs, batch, h] -> [T, batch, dirs * h].
            let y = self.op(op, &refs, attrs);
            let y = self.op("Transpose", &[&y], vec![attr_ints("perm", &[0, 2, 1, 3])]);
            let shape = self.i64s(&[0, 0, -1]);
            x = self.op("Reshape", &[&y, &shape], vec![]);
        }
        self.emit("Transpose", &[&x], out, vec![attr_ints("perm", &[1, 0, 2])]);
        Ok(())
    }

    fn reduce(
        &mut self,
        op: ReduceOp,
        axis: Option<usize>,
        keepdim: bool,
        xid: ValueId,
        x: &str,
        out: &str,
    ) -> Result<()> {
        let keep = attr_i("keepdims", i64::from(keepdim && axis.is_some()));
        let axes: Vec<i64> = match axis {
            Some(a) => vec![a as i64],
            None => (0..self.dims(xid).len() as i64).collect(),
        };
        match op {
            ReduceOp::Sum => {
                let a = self.i64s(&axes);
                self.emit("ReduceSum", &[x, &a], out, vec![keep]);
            }
            ReduceOp::Var { ddof } => {
                // mean((x - mean(x))^2) * n / (n - ddof), n the reduced count.
                let m = self.op(
                    "ReduceMean",
                    &[x],
                    vec![attr_ints("axes", &axes), attr_i("keepdims", 1)],
                );
                let d = self.op("Sub", &[x, &m], vec![]);
                let sq = self.op("Mul", &[&d, &d], vec![]);
                let v = self.op("ReduceMean", &[&sq], vec![attr_ints("axes", &axes), keep]);
                let dims = self.dims(xid).to_vec();
                let n = axes
                    .iter()
                    .map(|&a| dims[a as usize].clone())
                    .fold(Dim::Fixed(1), |p, d| p.mul(&d));
                let dt = self.dtype(xid);
                match n.fixed() {
                    Some(n) => {
                        let c = self.scalar(dt, n as f64 / (n as f64 - ddof as f64));
                        self.emit("Mul", &[&v, &c], out, vec![]);
                    }
                    None => {
                        let n = self.size(&n)?;
                        let nf = self.op("Cast", &[&n], vec![attr_i("to", data_type(dt) as i64)]);
                        let dd = self.scalar(dt, ddof as f64);
                        let den = self.op("Sub", &[&nf, &dd], vec![]);
                        let r = self.op("Div", &[&nf, &den], vec![]);
                        self.emit("Mul", &[&v, &r], out, vec![]);
                    }
                }
            }
            other => {
                let name = match other {
                    ReduceOp::Mean => "ReduceMean",
                    ReduceOp::Max => "ReduceMax",
                    ReduceOp::Min => "ReduceMin",
                    ReduceOp::Prod => "ReduceProd",
                    _ => "ReduceLogSumExp",
                };
                self.emit(name, &[x], out, vec![attr_ints("axes", &axes), keep]);
            }
        }
        Ok(())
    }

    /// Scaled dot-product attention as primitive ops: `softmax(q k^T *
    /// scale + mask) v`, a causal mask built from the run-time lengths.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        ids: &[ValueId],
        ins: &[String],
        scale: f64,
        causal: bool,
        mask: bool,
        dt: DType,
        out: &str,
    ) -> Result<()> {
        let kr = self.dims(ids[1]).len() as i64;
        let mut perm: Vec<i64> = (0..kr).collect();
        perm.swap(kr as usize - 2, kr as usize - 1);
        let kt = self.op("Transpose", &[&ins[1]], vec![attr_ints("perm", &perm)]);
        let s = self.op("MatMul", &[&ins[0], &kt], vec![]);
        let c = self.scalar(dt, scale);
        let mut s = self.op("Mul", &[&s, &c], vec![]);
        if mask {
            s = self.op("Add", &[&s, &ins[3]], vec![]);
        }
        if causal {
            // Query i sees key j when j <= i: PyTorch's causal mask is
            // aligned to the top left (`tril` of the t x s scores).
            let qd = self.dims(ids[0]).to_vec();
            let kd = self.dims(ids[1]).to_vec();
            let (t, sl) = (self.size(&qd[qd.len() - 2])?, self.size(&kd[kd.len() - 2])?);
            let zero = self.scalar(DType::I64, 0.0);
            let one = self.scalar(DType::I64, 1.0);
            let t0 = self.op("Squeeze", &[&t], vec![]);
            let s0 = self.op("Squeeze", &[&sl], vec![]);
            let i = self.op("Range", &[&zero, &t0, &one], vec![]);
            let j = self.op("Range", &[&zero, &s0, &one], vec![]);
            let ax = self.i64s(&[1]);
            let ic = self.op("Unsqueeze", &[&i, &ax], vec![]);
            let hidden = self.op("Greater", &[&j, &ic], vec![]);
            let ninf = self.scalar(dt, f64::NEG_INFINITY);
            s = self.op("Where", &[&hidden, &ninf, &s], vec![]);
        }
        let p = self.op("Softmax", &[&s], vec![attr_i("axis", -1)]);
        self.emit("MatMul", &[&p, &ins[2]], out, vec![]);
        Ok(())
    }
}

/// ONNX's `pads` (begin of each axis, then end of each) for PyTorch's
/// symmetric `[h, w]` padding.
fn pads(p: [usize; 2]) -> Vec<i64> {
    ints([p[0], p[1], p[0], p[1]])
}

/// The attributes `Conv` and `ConvTranspose` share, the kernel size read
/// from the weight's sizes `w`.
fn conv_attrs(w: &[Dim], p: &Conv2dParams) -> Result<Vec<AttributeProto>> {
    Ok(vec![
        attr_ints("kernel_shape", &fixed_all(&w[2..])?),
        attr_ints("strides", &ints(p.stride)),
        attr_ints("pads", &pads(p.padding)),
        attr_ints("dilations", &ints(p.dilation)),
        attr_i("group", p.groups as i64),
    ])
}

fn fixed_all(d: &[Dim]) -> Result<Vec<i64>> {
    d.iter()
        .map(|d| {
            d.fixed()
                .map(|n| n as i64)
                .ok_or_else(|| Error::invalid("export_onnx", "a kernel size is symbolic"))
        })
        .collect()
}

/// The graph's parameters and constants as initializers, under `names`.
pub(crate) fn initializers(g: &Graph, names: &[String]) -> Vec<TensorProto> {
    g.values
        .iter()
        .zip(names)
        .filter_map(|(v, name)| match &v.source {
            Source::Param(d) | Source::Constant(d) => Some(TensorProto {
                dims: d.dims().iter().map(|&n| n as i64).collect(),
                data_type: data_type(d.dtype()),
                name: name.clone(),
                raw_data: d.bytes().to_vec(),
            }),
            _ => None,
        })
        .collect()
}
