//! `Retype`: a derived model converted to another element type or device
//! (`model.to_dtype::<f64>()`, `model.to_device(&cpu)`), as `nn.Module.to`
//! converts one: the same keys, parameters still parameters, float buffers
//! cast and integer buffers kept, train/eval kept, the original untouched.

use forma::nn::layers::{BatchNorm1d, Dropout, LayerNorm, Linear, Lstm};
use forma::nn::StateDict;
use forma::prelude::*;

#[derive(Module)]
struct Block<E: Float = f32, D: Device<E> = Cpu> {
    fc: Linear<8, 8, E, D>,
    norm: LayerNorm<8, E, D>,
}

#[derive(Module)]
struct Net<E: Float = f32, D: Device<E> = Cpu> {
    stem: Linear<4, 8, E, D>,
    bn: BatchNorm1d<8, E, D>,
    blocks: Vec<Block<E, D>>,
    head: Option<Linear<8, 2, E, D>>,
    drop: Dropout,
    scale: f64,
}

impl<E: Float, D: Device<E>> Net<E, D> {
    fn new(device: &D, rng: &mut Rng) -> Self {
        Net {
            stem: Linear::new(device, rng),
            bn: BatchNorm1d::new(device),
            blocks: (0..2)
                .map(|_| Block {
                    fc: Linear::new(device, rng),
                    norm: LayerNorm::new(device),
                })
                .collect(),
            head: Some(Linear::new(device, rng)),
            drop: Dropout::new(0.0, rng),
            scale: 0.5,
        }
    }

    fn forward(&self, x: &Tensor<(Dyn, C<4>), E, D>) -> Tensor<(Dyn, C<2>), E, D> {
        let mut h = self.bn.forward(self.stem.forward(x.clone()));
        for b in &self.blocks {
            h = b.norm.forward(b.fc.forward(h)).relu();
        }
        self.head
            .as_ref()
            .unwrap()
            .forward(h)
            .mul_scalar(self.scale)
    }
}

fn values(sd: &StateDict) -> Vec<(String, Vec<f64>, forma::core::DType)> {
    sd.iter()
        .map(|(k, t)| (k.to_string(), t.to_vec::<f64>(), t.dtype()))
        .collect()
}

#[test]
fn to_dtype_keeps_names_buffers_mode_and_parameters() {
    let mut rng = Rng::seed_from(1);
    let mut net: Net = Net::new(&Cpu, &mut rng);
    // Running statistics that are not the initial ones, then eval mode.
    let x = Tensor::<(Dyn, C<4>)>::randn((Dyn(6), C), &mut rng);
    let _ = net.forward(&x);
    net.eval();
    let before = values(&net.state_dict());

    let wide: Net<f64> = net.to_dtype::<f64>();
    let after = values(&wide.state_dict());
    assert_eq!(after.len(), before.len());
    for ((k, v, dt), (k2, v2, dt2)) in before.iter().zip(&after) {
        assert_eq!(k, k2);
        // f32 -> f64 is exact; the i64 counter stays i64.
        assert_eq!(v, v2, "{k}");
        let want = if *dt == forma::core::DType::I64 {
            *dt
        } else {
            forma::core::DType::F64
        };
        assert_eq!(*dt2, want, "{k}");
    }
    assert!(after.iter().any(|(k, v, dt)| k == "bn.num_batches_tracked"
        && *dt == forma::core::DType::I64
        && v == &[1.0]));
    // The mode is kept: eval uses the running statistics in both.
    assert!(!wide.is_training());
    let y32 = net.forward(&x).to_vec();
    let y64 = wide.forward(&x.to_dtype::<f64>()).to_vec();
    for (a, b) in y32.iter().zip(&y64) {
        assert!((f64::from(*a) - b).abs() < 1e-5, "{a} vs {b}");
    }
    // Parameters are still parameters: a step's gradients reach them, and
    // the original model's do not change.
    wide.forward(&x.to_dtype::<f64>()).sum_all().backward();
    assert!(wide.stem.weight.grad().is_some());
    assert!(wide.blocks[1]
        .norm
        .weight
        .as_ref()
        .and_then(Tensor::grad)
        .is_some());
    assert!(net.stem.weight.grad().is_none());
    assert!(
        !wide.bn.running_mean.as_ref().expect("tracked").needs_grad(),
        "a buffer became a parameter"
    );
}

#[test]
fn to_bf16_rounds_and_to_device_copies() {
    let mut rng = Rng::seed_from(2);
    let net: Net = Net::new(&Cpu, &mut rng);
    let low: Net<bf16> = net.to_dtype::<bf16>();
    let w = net.stem.weight.to_vec();
    let lw = low.stem.weight.to_vec();
    assert!(w.iter().zip(&lw).all(|(a, b)| bf16::from_f32(*a) == *b));
    assert!(
        w.iter().zip(&lw).any(|(a, b)| b.to_f32() != *a),
        "nothing was rounded"
    );

    let copy: Net = net.to_device(&Cpu);
    assert_eq!(values(&copy.state_dict()), values(&net.state_dict()));
    assert!(!copy.stem.weight.shares_storage(&net.stem.weight));
    assert!(copy.stem.weight.needs_grad() && copy.stem.weight.is_leaf());
}

#[test]
fn recurrent_layers_convert_with_their_pytorch_keys() {
    let mut rng = Rng::seed_from(3);
    let lstm = Lstm::<3, 5>::new(2, &Cpu, &mut rng);
    let wide = lstm.to_dtype::<f64>();
    let (a, b) = (values(&lstm.state_dict()), values(&wide.state_dict()));
    assert_eq!(a.len(), 8);
    for ((k, v, _), (k2, v2, dt)) in a.iter().zip(&b) {
        assert_eq!((k, v), (k2, v2));
        assert_eq!(*dt, forma::core::DType::F64);
    }
}
